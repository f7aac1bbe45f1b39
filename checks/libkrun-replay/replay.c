/*
 * krun-gpu: libkrun's virglrenderer calls, replayed without a VM.
 *
 * krunkit starts libkrun with VIRGL_RENDERER_VENUS | VIRGL_RENDERER_NO_VIRGL and
 * libkrun's rutabaga_gfx drives virglrenderer in the VMM's own process.  This
 * program makes the calls libkrun v1.19.0 makes, in its order and with those
 * flags, each one naming the line of libkrun that makes it (paths relative to
 * the libkrun tree; rutabaga = src/rutabaga_gfx/src, gpu = src/devices/src/virtio/gpu),
 * and checks each answer against what libkrun needs from it.
 *
 *   replay apir   the APIR route as krunkit runs it: the Venus capset, with
 *                 VIRGL_ROUTE_VENUS_TO_APIR=1 in the environment (libkrun 1.19
 *                 knows no APIR capset: rutabaga_core.rs:1272-1275), a reply blob,
 *                 one APIR HANDSHAKE round trip, a fence
 *   replay venus  a Venus context: its capset, a mappable shared-memory blob
 *                 (blob id 0), a fence on the CPU ring
 *
 * --expect-handle apple|shm|opaque|dmabuf: the handle type export_blob must give
 * at creation (default: apple on macOS, shm elsewhere).
 *
 * One JSON object per call on stdout; the last line is {"ok": true|false}.
 * Exit status 0 only when every call answered as libkrun needs.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "virglrenderer.h"

#ifndef VIRGL_RENDERER_BLOB_FD_TYPE_APPLE
/* rutabaga's RUTABAGA_MEM_HANDLE_TYPE_APPLE as virglrenderer names it
 * (rutabaga virgl_renderer.rs:408); absent from a tree without our series */
#define VIRGL_RENDERER_BLOB_FD_TYPE_APPLE 0x0004
#endif

/* virtgpu_drm.h capset ids */
#define CAPSET_VENUS 4
#define CAPSET_APIR 10

/* APIR wire format of MR 1590 (src/apir/apir-protocol.h, apir-codec.c) */
#define APIR_COMMAND_TYPE_HANDSHAKE 0
#define APIR_HANDSHAKE_MAGIC 43806
/* the guest offsets APIR commands past Venus's on the Venus capset
 * (ggml-virtgpu virtgpu.cpp; the host takes it off in apir-renderer.c) */
#define VENUS_COMMAND_TYPE_LENGTH 331

static int failures;

static void
report(bool ok, const char *call, const char *cite, const char *fmt, ...)
{
   char detail[512] = "";
   if (fmt) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(detail, sizeof(detail), fmt, ap);
      va_end(ap);
   }
   for (char *p = detail; *p; p++) {
      if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
         *p = ' ';
   }
   printf("{\"call\": \"%s\", \"libkrun\": \"%s\", \"ok\": %s, \"detail\": \"%s\"}\n", call, cite,
          ok ? "true" : "false", detail);
   fflush(stdout);
   if (!ok)
      failures++;
}

/* --- the callbacks libkrun hands over (rutabaga virgl_renderer.rs:250-270, version 3) --- */

struct cookie {
   uint32_t ctx_id;
   uint32_t ring_idx;
   uint64_t fence_id;
   int context_fences;
};

static void
cb_write_fence(void *cookie, uint32_t fence)
{
   (void)cookie;
   (void)fence;
}

/* rutabaga virgl_renderer.rs:194 */
static void
cb_write_context_fence(void *opaque, uint32_t ctx_id, uint32_t ring_idx, uint64_t fence_id)
{
   struct cookie *cookie = opaque;
   __atomic_store_n(&cookie->ctx_id, ctx_id, __ATOMIC_SEQ_CST);
   __atomic_store_n(&cookie->ring_idx, ring_idx, __ATOMIC_SEQ_CST);
   __atomic_store_n(&cookie->fence_id, fence_id, __ATOMIC_SEQ_CST);
   __atomic_add_fetch(&cookie->context_fences, 1, __ATOMIC_SEQ_CST);
}

/* rutabaga virgl_renderer.rs:231: libkrun passes no server fd (gpu virtio_gpu.rs:281,
 * build(fence, None)), so this answers -1 */
static int
cb_get_server_fd(void *cookie, uint32_t version)
{
   (void)cookie;
   (void)version;
   return -1;
}

static struct virgl_renderer_callbacks callbacks = {
   .version = 3,
   .write_fence = cb_write_fence,
   .write_context_fence = cb_write_context_fence,
   .get_server_fd = cb_get_server_fd,
};

/* rutabaga virgl_renderer.rs:162 */
static void
cb_debug(const char *fmt, va_list ap)
{
   fputs("virgl: ", stderr);
   vfprintf(stderr, fmt, ap);
   fputc('\n', stderr);
}

typedef int (*get_map_ptr_fn)(uint32_t res_handle, uint64_t *map_ptr);

static const char *
handle_name(uint32_t fd_type)
{
   switch (fd_type) {
   case VIRGL_RENDERER_BLOB_FD_TYPE_DMABUF:
      return "dmabuf";
   case VIRGL_RENDERER_BLOB_FD_TYPE_OPAQUE:
      return "opaque";
   case VIRGL_RENDERER_BLOB_FD_TYPE_SHM:
      return "shm";
   case VIRGL_RENDERER_BLOB_FD_TYPE_APPLE:
      return "apple";
   default:
      return "unknown";
   }
}

struct blob {
   uint32_t res_id;
   uint64_t size;
   uint32_t fd_type;
   int fd;
   void *map_ptr;  /* virgl_renderer_resource_get_map_ptr: what libkrun maps on macOS */
   void *fd_map;   /* the exported fd mapped as libkrun maps it on Linux */
};

/* rutabaga create_blob, virgl_renderer.rs:644-693, for a guest RESOURCE_CREATE_BLOB
 * (gpu virtio_gpu.rs:719-756: HOST3D, so no iovecs) */
static bool
create_blob(uint32_t ctx_id, struct blob *b, uint64_t blob_id, const char *expect_handle)
{
   struct virgl_renderer_resource_create_blob_args args = {
      .res_handle = b->res_id,
      .ctx_id = ctx_id,
      .blob_mem = VIRGL_RENDERER_BLOB_MEM_HOST3D,
      .blob_flags = VIRGL_RENDERER_BLOB_FLAG_USE_MAPPABLE,
      .blob_id = blob_id,
      .size = b->size,
   };
   int ret = virgl_renderer_resource_create_blob(&args);
   report(ret == 0, "virgl_renderer_resource_create_blob", "rutabaga virgl_renderer.rs:672",
          "res %u size %" PRIu64 " blob_id %" PRIu64 ": ret %d", b->res_id, b->size, blob_id, ret);
   if (ret)
      return false;

   /* right after the create, before any map: the answer rutabaga caches (:679 before :685;
    * rutabaga_core.rs:913-939 hands out the cached handle, never asking again) */
   b->fd = -1;
   ret = virgl_renderer_resource_export_blob(b->res_id, &b->fd_type, &b->fd);
   bool want = ret == 0 && strcmp(handle_name(b->fd_type), expect_handle) == 0 && b->fd >= 0;
   report(want, "virgl_renderer_resource_export_blob", "rutabaga virgl_renderer.rs:679 (-> :394)",
          "ret %d type %u (%s) fd %d; libkrun maps it only as %s", ret, b->fd_type,
          handle_name(b->fd_type), b->fd, expect_handle);

   uint32_t map_info = 0;
   ret = virgl_renderer_resource_get_map_info(b->res_id, &map_info);
   report(ret == 0 && (map_info & VIRGL_RENDERER_MAP_CACHE_MASK) != 0,
          "virgl_renderer_resource_get_map_info", "rutabaga virgl_renderer.rs:683 (-> :352)",
          "ret %d map_info 0x%x", ret, map_info);

   /* macOS: the pointer resource_map_blob hands to the hypervisor (gpu virtio_gpu.rs:900-926) */
   get_map_ptr_fn get_map_ptr = (get_map_ptr_fn)dlsym(RTLD_DEFAULT,
                                                      "virgl_renderer_resource_get_map_ptr");
   uint64_t ptr = 0;
   ret = get_map_ptr ? get_map_ptr(b->res_id, &ptr) : -ENOSYS;
   b->map_ptr = (void *)(uintptr_t)ptr;
   report(ret == 0 && ptr != 0, "virgl_renderer_resource_get_map_ptr",
          "rutabaga virgl_renderer.rs:685 (-> :364, macOS)", "%s ret %d ptr %p",
          get_map_ptr ? "" : "symbol missing:", ret, b->map_ptr);

   /* Linux: resource_map_blob mmaps the cached handle's fd MAP_SHARED (gpu virtio_gpu.rs:771-800) */
   if (b->fd_type == VIRGL_RENDERER_BLOB_FD_TYPE_SHM ||
       b->fd_type == VIRGL_RENDERER_BLOB_FD_TYPE_DMABUF) {
      void *m = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
      b->fd_map = m == MAP_FAILED ? NULL : m;
      report(b->fd_map != NULL, "mmap(exported fd)", "gpu virtio_gpu.rs:789 (Linux)", "%s",
             b->fd_map ? "" : strerror(errno));
   }

   /* the guest attaches what it created (rutabaga virgl_renderer.rs:119) */
   virgl_renderer_ctx_attach_resource((int)ctx_id, (int)b->res_id);
   return b->map_ptr || b->fd_map;
}

/* both views libkrun could map are the same memory */
static void
check_views_agree(struct blob *b)
{
   if (!b->map_ptr || !b->fd_map)
      return;
   volatile uint32_t *a = b->map_ptr, *f = b->fd_map;
   a[b->size / 4 - 1] = 0x6b72756e;
   bool same = f[b->size / 4 - 1] == 0x6b72756e;
   f[b->size / 4 - 2] = 0x67707521;
   same = same && a[b->size / 4 - 2] == 0x67707521;
   report(same, "get_map_ptr vs mmap(fd)", "gpu virtio_gpu.rs:900-926 vs :771-800",
          "a write through one mapping %s through the other", same ? "is read" : "is NOT seen");
}

static void
destroy_blob(uint32_t ctx_id, struct blob *b)
{
   if (b->fd_map)
      munmap(b->fd_map, b->size);
   /* rutabaga's handle is a SafeDescriptor: dropped, it closes the fd */
   if (b->fd >= 0)
      close(b->fd);
   virgl_renderer_ctx_detach_resource((int)ctx_id, (int)b->res_id); /* virgl_renderer.rs:127 */
   virgl_renderer_resource_unref(b->res_id);                         /* virgl_renderer.rs:552 */
   report(true, "virgl_renderer_resource_unref", "rutabaga virgl_renderer.rs:552", "res %u",
          b->res_id);
}

static bool
fence_round_trip(struct cookie *cookie, uint32_t ctx_id, uint32_t ring_idx, uint64_t fence_id)
{
   int before = __atomic_load_n(&cookie->context_fences, __ATOMIC_SEQ_CST);
   /* a fenced command with RING_IDX (gpu worker.rs:399-411 -> rutabaga_core.rs:555-562) */
   int ret = virgl_renderer_context_create_fence(ctx_id, VIRGL_RENDERER_FENCE_FLAG_MERGEABLE,
                                                 ring_idx, fence_id);
   report(ret == 0, "virgl_renderer_context_create_fence", "rutabaga virgl_renderer.rs:142",
          "ctx %u ring %u fence %" PRIu64 ": ret %d", ctx_id, ring_idx, fence_id, ret);
   if (ret)
      return false;

   /* libkrun never calls virgl_renderer_poll (no caller of event_poll in gpu/): the fence
    * must come back on its own */
   for (int i = 0; i < 2000; i++) {
      if (__atomic_load_n(&cookie->context_fences, __ATOMIC_SEQ_CST) > before &&
          __atomic_load_n(&cookie->fence_id, __ATOMIC_SEQ_CST) >= fence_id)
         break;
      usleep(1000);
   }
   bool ok = __atomic_load_n(&cookie->context_fences, __ATOMIC_SEQ_CST) > before &&
             cookie->ctx_id == ctx_id && cookie->ring_idx == ring_idx &&
             cookie->fence_id == fence_id;
   report(ok, "write_context_fence (callback)", "rutabaga virgl_renderer.rs:194",
          "ctx %u ring %u fence %" PRIu64 " %s", cookie->ctx_id, cookie->ring_idx,
          cookie->fence_id, ok ? "retired" : "never retired within 2 s");
   return ok;
}

static bool
capset(uint32_t id, void **caps, uint32_t *size)
{
   uint32_t max_ver = 0, max_size = 0;
   virgl_renderer_get_cap_set(id, &max_ver, &max_size);
   report(max_size > 0, "virgl_renderer_get_cap_set", "rutabaga virgl_renderer.rs:441",
          "capset %u: version %u size %u", id, max_ver, max_size);
   if (!max_size)
      return false;
   uint8_t *buf = calloc(1, max_size);
   virgl_renderer_fill_caps(id, max_ver, buf);
   bool filled = false;
   for (uint32_t i = 0; i < max_size; i++)
      filled = filled || buf[i];
   report(filled, "virgl_renderer_fill_caps", "rutabaga virgl_renderer.rs:452",
          "capset %u %s", id, filled ? "filled" : "left empty (all zero)");
   *caps = buf;
   *size = max_size;
   return filled;
}

static int
replay(const char *route, const char *expect_handle)
{
   struct cookie cookie = { 0 };
   const bool apir = strcmp(route, "apir") == 0;

   virgl_set_debug_callback(cb_debug); /* rutabaga virgl_renderer.rs:315 */

   /* krunkit v1.3.1 src/context.rs:37-38,174 -> krun_set_gpu_options2 (src/libkrun/src/lib.rs
    * :1542-1557) -> RutabagaBuilder::new(.., virgl_flags, 0) (gpu virtio_gpu.rs:267-272),
    * unchanged with capset mask 0 (rutabaga_core.rs:1213) */
   const int flags = VIRGL_RENDERER_VENUS | VIRGL_RENDERER_NO_VIRGL;
   int ret = virgl_renderer_init(&cookie, flags, &callbacks);
   report(ret == 0, "virgl_renderer_init", "rutabaga virgl_renderer.rs:330",
          "flags 0x%x (VENUS|NO_VIRGL), no render server fd: ret %d", flags, ret);
   if (ret)
      return 1;

   /* the guest reads every capset rutabaga lists (rutabaga_core.rs:1272-1275); the route
    * uses Venus's */
   void *caps = NULL;
   uint32_t caps_size = 0;
   capset(CAPSET_VENUS, &caps, &caps_size);
   if (apir && caps && caps_size >= 4) {
      /* with the route the Venus capset is APIR's: apir_version 1 first (apir-hw.h) */
      uint32_t apir_version;
      memcpy(&apir_version, caps, 4);
      report(apir_version == 1, "capset content", "rutabaga virgl_renderer.rs:452",
             "Venus capset answers with APIR's (apir_version %u)", apir_version);
   }
   free(caps);

   /* the guest's CONTEXT_INIT with the Venus capset id (rutabaga virgl_renderer.rs:803) */
   const uint32_t ctx_id = 1;
   const char name[] = "krun-replay";
   ret = virgl_renderer_context_create_with_flags(ctx_id, CAPSET_VENUS, sizeof(name) - 1, name);
   report(ret == 0, "virgl_renderer_context_create_with_flags", "rutabaga virgl_renderer.rs:803",
          "ctx %u capset %u: ret %d", ctx_id, CAPSET_VENUS, ret);
   if (ret) {
      virgl_renderer_cleanup(NULL);
      return 1;
   }

   struct blob reply = { .res_id = 1, .size = 16384 };
   if (create_blob(ctx_id, &reply, 0, expect_handle)) {
      check_views_agree(&reply);
      volatile uint32_t *view = reply.map_ptr ? reply.map_ptr : reply.fd_map;

      if (apir) {
         /* ggml-virtgpu's handshake: type, flags, reply resource, guest major.minor */
         memset((void *)view, 0, 64);
         uint32_t cmd[5] = { VENUS_COMMAND_TYPE_LENGTH + APIR_COMMAND_TYPE_HANDSHAKE, 0,
                             reply.res_id, 0, 1 };
         ret = virgl_renderer_submit_cmd(cmd, (int)ctx_id, 5);
         report(ret == 0, "virgl_renderer_submit_cmd", "rutabaga virgl_renderer.rs:101",
                "APIR HANDSHAKE, %zu bytes: ret %d", sizeof(cmd), ret);
         /* the reply: notification word (1 + return code), then host major, minor */
         uint32_t notif = view[0], major = view[1], minor = view[2];
         report(notif == 1 + APIR_HANDSHAKE_MAGIC, "APIR reply (shared memory)",
                "gpu virtio_gpu.rs:900-926 (the guest's view of the blob)",
                "notif %u (want %u) host protocol %u.%u", notif, 1 + APIR_HANDSHAKE_MAGIC, major,
                minor);
      } else {
         /* no Venus command stream without a guest encoder: an empty submission is valid */
         uint32_t none[1] = { 0 };
         ret = virgl_renderer_submit_cmd(none, (int)ctx_id, 0);
         report(ret == 0, "virgl_renderer_submit_cmd", "rutabaga virgl_renderer.rs:101",
                "empty Venus submission: ret %d", ret);
      }
      fence_round_trip(&cookie, ctx_id, 0, 1);
      destroy_blob(ctx_id, &reply);
   }

   virgl_renderer_context_destroy(ctx_id); /* rutabaga virgl_renderer.rs:157 */
   report(true, "virgl_renderer_context_destroy", "rutabaga virgl_renderer.rs:157", NULL);
   virgl_renderer_cleanup(NULL); /* rutabaga virgl_renderer.rs:429 */
   report(true, "virgl_renderer_cleanup", "rutabaga virgl_renderer.rs:429", NULL);
   return 0;
}

int
main(int argc, char **argv)
{
#ifdef __APPLE__
   const char *expect_handle = "apple";
#else
   const char *expect_handle = "shm";
#endif
   const char *route = NULL;
   for (int i = 1; i < argc; i++) {
      if (!strcmp(argv[i], "--expect-handle") && i + 1 < argc)
         expect_handle = argv[++i];
      else if (!route && (!strcmp(argv[i], "apir") || !strcmp(argv[i], "venus")))
         route = argv[i];
      else {
         fprintf(stderr, "usage: %s apir|venus [--expect-handle apple|shm|opaque|dmabuf]\n",
                 argv[0]);
         return 2;
      }
   }
   if (!route) {
      fprintf(stderr, "usage: %s apir|venus [--expect-handle apple|shm|opaque|dmabuf]\n", argv[0]);
      return 2;
   }
   if (!strcmp(route, "apir") && !getenv("VIRGL_ROUTE_VENUS_TO_APIR")) {
      fprintf(stderr, "replay apir: set VIRGL_ROUTE_VENUS_TO_APIR=1, as the route's launcher does\n");
      return 2;
   }

   replay(route, expect_handle);
   printf("{\"ok\": %s, \"failures\": %d}\n", failures ? "false" : "true", failures);
   return failures ? 1 : 0;
}
