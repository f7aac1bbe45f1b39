"""The request and response bodies, as pydantic models: they validate input and make the OpenAPI schema."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from provision.api.settings import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S

STACK_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    language: str = Field(
        validation_alias=AliasChoices("language", "stack"),
        pattern=STACK_PATTERN,
        description="the stack to run in (`stack` is accepted as an alias); GET /api/v1/stacks lists them",
        examples=["llama-linux"],
    )
    gpu: bool = Field(False, description="give the guest the host GPU; E007 (400) on a stack without GPU")
    timeout: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="seconds from acceptance (waiting for a VM place or GPU slot included); E021 (408) past it",
    )
    code: str = Field(min_length=1, description="shell code, run as `sh -c CODE` in a fresh guest")
    model: str | None = Field(
        None, max_length=128, description="a model already in the server's store, mounted read-only at $MODEL"
    )


class ErrorDetail(BaseModel):
    name: str
    code: str = Field(description="stable error code (README's error table)", examples=["E007"])
    message: str
    fix: str | None
    exit_status: int = Field(description="what `provision` would exit with for this error")


class ErrorBody(BaseModel):
    status: int
    error: ErrorDetail


class ExecuteResult(BaseModel):
    event: str = Field("exit", description='always "exit" (the same record ends the stream)')
    job: str
    stack: str
    route: str = Field(description="venus, apir, or cpu (a guest without GPU)")
    gpu: bool
    device: str | None = Field(description="the guest's Vulkan device with gpu on the Venus route; cpu without gpu")
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    accel: str = Field(description="kvm or tcg")
    qemu_pid: int
    accepted_at: str = Field(description="ISO 8601 UTC")
    started_at: str = Field(description="when the guest's VM was started")
    ended_at: str = Field(description="when the VM was gone")
    queued_s: float
    duration_s: float


class StackInfo(BaseModel):
    name: str
    route: str
    gpu: bool
    device: str | None
    hosts: list[str]
    description: str
    runs_here: bool = Field(description="this server can run it (a Linux guest)")


class Health(BaseModel):
    status: str = Field(description='"ok", or "stopping" after SIGTERM')
    running: int = Field(description="jobs whose VM is up")
    waiting: int = Field(description="jobs waiting for a VM place or a GPU slot")
    max_vms: int
    gpu_slots: int
    version: str
