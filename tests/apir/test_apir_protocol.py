"""Guest 0.2 against the MR 1590 host 0.1: every command the pinned guest can send exists on
the host with the same id and codes (virglrenderer's layer, pinned from the host tree), and
every forwarded command has its entry in the host library's table (same llama.cpp tree)."""

from __future__ import annotations

from provision.apir import protocol as apir_protocol
from provision.images import sources


def test_pinned_guest_sends_nothing_the_pinned_host_lacks():
    tree = sources.llama_cpp_tree()
    guest = apir_protocol.guest_virgl_layer(tree)
    host = apir_protocol.pinned_host_virgl_layer()
    assert {"APIR_COMMAND_TYPE_HANDSHAKE", "APIR_COMMAND_TYPE_LOADLIBRARY", "APIR_COMMAND_TYPE_FORWARD"} <= set(guest)
    result = apir_protocol.compare(guest, host, tree)
    assert result.ok, result
    assert result.forwarded_count == 23


def test_a_command_the_host_lacks_or_numbers_differently_is_reported():
    tree = sources.llama_cpp_tree()
    guest = apir_protocol.guest_virgl_layer(tree)
    host = apir_protocol.pinned_host_virgl_layer()
    guest["APIR_COMMAND_TYPE_NEWTHING"] = 3
    host = {**host, "APIR_FORWARD_BASE_INDEX": 5}
    result = apir_protocol.compare(guest, host, tree)
    assert result.virgl_missing_on_host == ["APIR_COMMAND_TYPE_NEWTHING"]
    assert result.virgl_mismatched == ["APIR_FORWARD_BASE_INDEX: guest 4, host 5"]
    assert not result.ok


def test_virgl_header_parser_reads_camel_case_names():
    text = """
#define APIR_HANDSHAKE_MAGIC 0xab1e
typedef enum {
    APIR_COMMAND_TYPE_HandShake = 0,
    APIR_COMMAND_TYPE_Forward = 2,
} ApirCommandType;
typedef enum { APIR_LOAD_LIBRARY_SUCCESS = 0, } ApirLoadLibraryReturnCode;
typedef enum { APIR_FORWARD_BASE_INDEX = 4, } ApirForwardReturnCode;
"""
    layer = apir_protocol.virgl_layer(text)
    assert layer == {"APIR_COMMAND_TYPE_HANDSHAKE": 0, "APIR_COMMAND_TYPE_FORWARD": 2, "APIR_LOAD_LIBRARY_SUCCESS": 0,
                     "APIR_FORWARD_BASE_INDEX": 4, "APIR_HANDSHAKE_MAGIC": 0xAB1E}
