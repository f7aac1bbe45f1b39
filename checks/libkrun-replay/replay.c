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
 *   replay venus  a Venus context: its capset, a shared-memory blob (blob id 0,
 *                 the guest's reply stream), a fence on the CPU ring, then what
 *                 Mesa's venus driver sends for a host-visible allocation
 *                 (vkCreateInstance .. vkAllocateMemory, in the protocol's wire
 *                 format), a blob of that memory exported at creation and mapped,
 *                 and a vkCmdCopyBuffer on the device's queue (ring 1) whose
 *                 result is read through the mapping after the ring's fence
 *
 * --expect-handle apple|shm|opaque|dmabuf: the handle type export_blob must give
 * at creation (default: apple on macOS, shm elsewhere).
 * --expect-memory-handle: the same for the Venus memory blob (default: apple on
 * macOS, dmabuf elsewhere; a driver without dma-buf export, lavapipe, gives opaque).
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
   bool created;
};

/* rutabaga create_blob, virgl_renderer.rs:644-693, for a guest RESOURCE_CREATE_BLOB
 * (gpu virtio_gpu.rs:719-756: HOST3D, so no iovecs) */
static bool
create_blob(uint32_t ctx_id, struct blob *b, uint64_t blob_id, const char *expect_handle,
            const char *label)
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
          "%s: res %u size %" PRIu64 " blob_id %" PRIu64 ": ret %d", label, b->res_id, b->size,
          blob_id, ret);
   if (ret)
      return false;
   b->created = true;

   /* right after the create, before any map: the answer rutabaga caches (:679 before :685;
    * rutabaga_core.rs:913-939 hands out the cached handle, never asking again) */
   b->fd = -1;
   ret = virgl_renderer_resource_export_blob(b->res_id, &b->fd_type, &b->fd);
   bool want = ret == 0 && strcmp(handle_name(b->fd_type), expect_handle) == 0 && b->fd >= 0;
   report(want, "virgl_renderer_resource_export_blob", "rutabaga virgl_renderer.rs:679 (-> :394)",
          "%s: ret %d type %u (%s) fd %d; expected %s", label, ret, b->fd_type,
          handle_name(b->fd_type), b->fd, expect_handle);

   uint32_t map_info = 0;
   ret = virgl_renderer_resource_get_map_info(b->res_id, &map_info);
   report(ret == 0 && (map_info & VIRGL_RENDERER_MAP_CACHE_MASK) != 0,
          "virgl_renderer_resource_get_map_info", "rutabaga virgl_renderer.rs:683 (-> :352)",
          "%s: ret %d map_info 0x%x", label, ret, map_info);

   /* macOS: the pointer resource_map_blob hands to the hypervisor (gpu virtio_gpu.rs:900-926) */
   get_map_ptr_fn get_map_ptr = (get_map_ptr_fn)dlsym(RTLD_DEFAULT,
                                                      "virgl_renderer_resource_get_map_ptr");
   uint64_t ptr = 0;
   ret = get_map_ptr ? get_map_ptr(b->res_id, &ptr) : -ENOSYS;
   b->map_ptr = (void *)(uintptr_t)ptr;
   report(ret == 0 && ptr != 0, "virgl_renderer_resource_get_map_ptr",
          "rutabaga virgl_renderer.rs:685 (-> :364, macOS)", "%s: %sret %d ptr %p", label,
          get_map_ptr ? "" : "symbol missing: ", ret, b->map_ptr);

   /* Linux: resource_map_blob mmaps the cached handle's fd MAP_SHARED (gpu virtio_gpu.rs:771-800) */
   if (b->fd_type == VIRGL_RENDERER_BLOB_FD_TYPE_SHM ||
       b->fd_type == VIRGL_RENDERER_BLOB_FD_TYPE_DMABUF) {
      void *m = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
      b->fd_map = m == MAP_FAILED ? NULL : m;
      report(b->fd_map != NULL, "mmap(exported fd)", "gpu virtio_gpu.rs:789 (Linux)", "%s: %s",
             label, b->fd_map ? "mapped" : strerror(errno));
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
   if (!b->created)
      return;
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

/* --- a guest's Venus commands, in the wire format of Mesa's venus driver ---------------------
 *
 * What the guest's Vulkan driver sends through EXECBUFFER (libkrun: submit_cmd,
 * rutabaga virgl_renderer.rs:101), encoded as the tree's decoders read it
 * (src/venus/venus-protocol/vn_protocol_renderer_*.h): 4-byte words, 8-byte sizes,
 * pointers as a u64 presence count, handles as the u64 object ids the guest picks.
 * Values from vn_protocol_renderer_defines.h and the Vulkan headers. */

#define VN_CMD_vkCreateInstance 0
#define VN_CMD_vkEnumeratePhysicalDevices 2
#define VN_CMD_vkGetPhysicalDeviceMemoryProperties 8
#define VN_CMD_vkCreateDevice 11
#define VN_CMD_vkAllocateMemory 21
#define VN_CMD_vkBindBufferMemory 28
#define VN_CMD_vkCreateBuffer 50
#define VN_CMD_vkCreateCommandPool 85
#define VN_CMD_vkAllocateCommandBuffers 88
#define VN_CMD_vkBeginCommandBuffer 90
#define VN_CMD_vkEndCommandBuffer 91
#define VN_CMD_vkCmdCopyBuffer 112
#define VN_CMD_vkQueueSubmit 18
#define VN_CMD_vkGetDeviceQueue2 155
#define VN_CMD_vkSetReplyCommandStreamMESA 178
#define VN_CMD_vkSeekReplyCommandStreamMESA 179
#define VN_GENERATE_REPLY 0x1

#define VN_STYPE_SUBMIT_INFO 4
#define VN_STYPE_MEMORY_ALLOCATE_INFO 5
#define VN_STYPE_BUFFER_CREATE_INFO 12
#define VN_STYPE_COMMAND_POOL_CREATE_INFO 39
#define VN_STYPE_COMMAND_BUFFER_ALLOCATE_INFO 40
#define VN_STYPE_COMMAND_BUFFER_BEGIN_INFO 42
#define VN_STYPE_INSTANCE_CREATE_INFO 1
#define VN_STYPE_DEVICE_QUEUE_CREATE_INFO 2
#define VN_STYPE_DEVICE_CREATE_INFO 3
#define VN_STYPE_DEVICE_QUEUE_INFO_2 1000145003
#define VN_STYPE_DEVICE_QUEUE_TIMELINE_INFO_MESA 1000384005

#define VN_HOST_VISIBLE_COHERENT (0x2 | 0x4)
#define VN_BUFFER_USAGE_TRANSFER_SRC_DST (0x1 | 0x2)

struct vn_enc {
   uint32_t words[1024];
   uint32_t count;
};

static void
vn_u32(struct vn_enc *e, uint32_t v)
{
   if (e->count < sizeof(e->words) / sizeof(e->words[0]))
      e->words[e->count] = v;
   e->count++;
}

static void
vn_u64(struct vn_enc *e, uint64_t v)
{
   vn_u32(e, (uint32_t)v);
   vn_u32(e, (uint32_t)(v >> 32));
}

static void
vn_cmd(struct vn_enc *e, uint32_t type, uint32_t flags)
{
   vn_u32(e, type);
   vn_u32(e, flags);
}

/* a struct's sType and an empty pNext chain */
static void
vn_stype(struct vn_enc *e, uint32_t stype)
{
   vn_u32(e, stype);
   vn_u64(e, 0);
}

struct venus_guest {
   uint32_t ctx_id;
   volatile uint32_t *reply; /* the reply stream: the shared-memory blob's first bytes */
   char error[160];
};

/* one EXECBUFFER; with a reply, the reply stream is rewound first and the
 * VkResult (the word after the command type) is returned through *result */
static bool
vn_submit(struct venus_guest *g, struct vn_enc *e, int32_t *result)
{
   if (e->count > sizeof(e->words) / sizeof(e->words[0])) {
      snprintf(g->error, sizeof(g->error), "command too long");
      return false;
   }
   if (result)
      g->reply[1] = 0x7fffffff;
   int ret = virgl_renderer_submit_cmd(e->words, (int)g->ctx_id, (int)e->count);
   if (ret) {
      snprintf(g->error, sizeof(g->error), "submit_cmd: ret %d (vkr refused the stream)", ret);
      return false;
   }
   if (result)
      *result = (int32_t)g->reply[1];
   return true;
}

static void
vn_seek_reply(struct vn_enc *e)
{
   vn_cmd(e, VN_CMD_vkSeekReplyCommandStreamMESA, 0);
   vn_u64(e, 0);
}

/* a command whose reply carries a VkResult, which must be VK_SUCCESS (0) */
static bool
vn_call(struct venus_guest *g, struct vn_enc *e, const char *what)
{
   int32_t result = 0;
   if (!vn_submit(g, e, &result)) {
      snprintf(g->error + strlen(g->error), sizeof(g->error) - strlen(g->error), " at %s", what);
      return false;
   }
   if (result != 0) {
      snprintf(g->error, sizeof(g->error), "%s: VkResult %d", what, result);
      return false;
   }
   return true;
}

/* object ids the guest picks (vn_object_id) */
enum {
   VN_ID_INSTANCE = 1,
   VN_ID_PHYSICAL_DEVICE,
   VN_ID_DEVICE,
   VN_ID_QUEUE,
   VN_ID_MEMORY,
   VN_ID_BUFFER,
   VN_ID_COMMAND_POOL,
   VN_ID_COMMAND_BUFFER,
};

/* what Mesa's venus driver sends before a host-visible allocation: the reply
 * stream, an instance, its first physical device, a device with one queue bound to
 * ring 1 (VkDeviceQueueTimelineInfoMESA), then vkAllocateMemory of a host-visible
 * coherent type; *mem_type is the type used */
static bool
venus_allocate(struct venus_guest *g, uint32_t reply_res, uint64_t size, uint32_t *mem_type)
{
   struct vn_enc e = { 0 };
   vn_cmd(&e, VN_CMD_vkSetReplyCommandStreamMESA, 0);
   vn_u64(&e, 1);
   vn_u32(&e, reply_res);
   vn_u64(&e, 0);    /* offset */
   vn_u64(&e, 4096); /* size */
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkCreateInstance, VN_GENERATE_REPLY);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_INSTANCE_CREATE_INFO);
   vn_u32(&e, 0); /* flags */
   vn_u64(&e, 0); /* pApplicationInfo */
   vn_u32(&e, 0); /* layers */
   vn_u64(&e, 0);
   vn_u32(&e, 0); /* extensions */
   vn_u64(&e, 0);
   vn_u64(&e, 0); /* pAllocator */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_INSTANCE);
   if (!vn_call(g, &e, "vkCreateInstance"))
      return false;

   e.count = 0;
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkEnumeratePhysicalDevices, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_INSTANCE);
   vn_u64(&e, 1);
   vn_u32(&e, 1); /* *pPhysicalDeviceCount: room for one */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_PHYSICAL_DEVICE);
   int32_t result = 0;
   if (!vn_submit(g, &e, &result))
      return false;
   /* reply: type, result, pointer, count */
   if ((result != 0 && result != 5 /* VK_INCOMPLETE */) || g->reply[4] < 1) {
      snprintf(g->error, sizeof(g->error), "vkEnumeratePhysicalDevices: VkResult %d, %u devices",
               result, g->reply[4]);
      return false;
   }

   e.count = 0;
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkGetPhysicalDeviceMemoryProperties, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_PHYSICAL_DEVICE);
   vn_u64(&e, 1);
   vn_u64(&e, 32); /* memoryTypes[VK_MAX_MEMORY_TYPES], to be filled */
   vn_u64(&e, 16); /* memoryHeaps[VK_MAX_MEMORY_HEAPS], to be filled */
   if (!vn_submit(g, &e, NULL))
      return false;
   /* reply: type, pointer (2 words), memoryTypeCount, array size (2), {flags, heap} x 32 */
   uint32_t type_count = g->reply[3];
   *mem_type = UINT32_MAX;
   for (uint32_t i = 0; i < type_count && i < 32; i++) {
      if ((g->reply[6 + 2 * i] & VN_HOST_VISIBLE_COHERENT) == VN_HOST_VISIBLE_COHERENT) {
         *mem_type = i;
         break;
      }
   }
   if (*mem_type == UINT32_MAX) {
      snprintf(g->error, sizeof(g->error), "no host-visible coherent type among %u", type_count);
      return false;
   }

   e.count = 0;
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkCreateDevice, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_PHYSICAL_DEVICE);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_DEVICE_CREATE_INFO);
   vn_u32(&e, 0); /* flags */
   vn_u32(&e, 1); /* queueCreateInfoCount */
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_DEVICE_QUEUE_CREATE_INFO);
   vn_u32(&e, 0); /* flags */
   vn_u32(&e, 0); /* queueFamilyIndex */
   vn_u32(&e, 1); /* queueCount */
   vn_u64(&e, 1);
   const float priority = 1.0f;
   uint32_t priority_bits;
   memcpy(&priority_bits, &priority, 4);
   vn_u32(&e, priority_bits);
   vn_u32(&e, 0); /* layers */
   vn_u64(&e, 0);
   vn_u32(&e, 0); /* extensions */
   vn_u64(&e, 0);
   vn_u64(&e, 0); /* pEnabledFeatures */
   vn_u64(&e, 0); /* pAllocator */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_DEVICE);
   if (!vn_call(g, &e, "vkCreateDevice"))
      return false;

   /* the queue, bound to ring 1: context fences on ring 1 follow its work */
   e.count = 0;
   vn_cmd(&e, VN_CMD_vkGetDeviceQueue2, 0);
   vn_u64(&e, VN_ID_DEVICE);
   vn_u64(&e, 1);
   vn_u32(&e, VN_STYPE_DEVICE_QUEUE_INFO_2);
   vn_u64(&e, 1); /* pNext: VkDeviceQueueTimelineInfoMESA */
   vn_u32(&e, VN_STYPE_DEVICE_QUEUE_TIMELINE_INFO_MESA);
   vn_u64(&e, 0);
   vn_u32(&e, 1); /* ringIdx */
   vn_u32(&e, 0); /* flags */
   vn_u32(&e, 0); /* queueFamilyIndex */
   vn_u32(&e, 0); /* queueIndex */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_QUEUE);
   if (!vn_submit(g, &e, NULL))
      return false;

   e.count = 0;
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkAllocateMemory, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_DEVICE);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_MEMORY_ALLOCATE_INFO);
   vn_u64(&e, size);
   vn_u32(&e, *mem_type);
   vn_u64(&e, 0); /* pAllocator */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_MEMORY);
   return vn_call(g, &e, "vkAllocateMemory");
}

/* the guest's copy of the allocation's first half onto its second half, on the GPU
 * queue (a buffer bound to the memory, one command buffer, vkQueueSubmit) */
static bool
venus_copy_halves(struct venus_guest *g, uint64_t size)
{
   struct vn_enc e = { 0 };
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkCreateBuffer, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_DEVICE);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_BUFFER_CREATE_INFO);
   vn_u32(&e, 0); /* flags */
   vn_u64(&e, size);
   vn_u32(&e, VN_BUFFER_USAGE_TRANSFER_SRC_DST);
   vn_u32(&e, 0); /* VK_SHARING_MODE_EXCLUSIVE */
   vn_u32(&e, 0); /* queueFamilyIndexCount */
   vn_u64(&e, 0);
   vn_u64(&e, 0); /* pAllocator */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_BUFFER);
   if (!vn_call(g, &e, "vkCreateBuffer"))
      return false;

   e.count = 0;
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkBindBufferMemory, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_DEVICE);
   vn_u64(&e, VN_ID_BUFFER);
   vn_u64(&e, VN_ID_MEMORY);
   vn_u64(&e, 0);
   if (!vn_call(g, &e, "vkBindBufferMemory"))
      return false;

   e.count = 0;
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkCreateCommandPool, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_DEVICE);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_COMMAND_POOL_CREATE_INFO);
   vn_u32(&e, 0); /* flags */
   vn_u32(&e, 0); /* queueFamilyIndex */
   vn_u64(&e, 0); /* pAllocator */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_COMMAND_POOL);
   if (!vn_call(g, &e, "vkCreateCommandPool"))
      return false;

   e.count = 0;
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkAllocateCommandBuffers, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_DEVICE);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_COMMAND_BUFFER_ALLOCATE_INFO);
   vn_u64(&e, VN_ID_COMMAND_POOL);
   vn_u32(&e, 0); /* VK_COMMAND_BUFFER_LEVEL_PRIMARY */
   vn_u32(&e, 1);
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_COMMAND_BUFFER);
   if (!vn_call(g, &e, "vkAllocateCommandBuffers"))
      return false;

   e.count = 0;
   vn_cmd(&e, VN_CMD_vkBeginCommandBuffer, 0);
   vn_u64(&e, VN_ID_COMMAND_BUFFER);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_COMMAND_BUFFER_BEGIN_INFO);
   vn_u32(&e, 0x1); /* ONE_TIME_SUBMIT */
   vn_u64(&e, 0);   /* pInheritanceInfo */
   vn_cmd(&e, VN_CMD_vkCmdCopyBuffer, 0);
   vn_u64(&e, VN_ID_COMMAND_BUFFER);
   vn_u64(&e, VN_ID_BUFFER);
   vn_u64(&e, VN_ID_BUFFER);
   vn_u32(&e, 1);
   vn_u64(&e, 1);
   vn_u64(&e, 0);        /* srcOffset */
   vn_u64(&e, size / 2); /* dstOffset */
   vn_u64(&e, size / 2); /* size */
   vn_cmd(&e, VN_CMD_vkEndCommandBuffer, 0);
   vn_u64(&e, VN_ID_COMMAND_BUFFER);
   vn_seek_reply(&e);
   vn_cmd(&e, VN_CMD_vkQueueSubmit, VN_GENERATE_REPLY);
   vn_u64(&e, VN_ID_QUEUE);
   vn_u32(&e, 1);
   vn_u64(&e, 1);
   vn_stype(&e, VN_STYPE_SUBMIT_INFO);
   vn_u32(&e, 0); /* waitSemaphoreCount */
   vn_u64(&e, 0);
   vn_u64(&e, 0);
   vn_u32(&e, 1); /* commandBufferCount */
   vn_u64(&e, 1);
   vn_u64(&e, VN_ID_COMMAND_BUFFER);
   vn_u32(&e, 0); /* signalSemaphoreCount */
   vn_u64(&e, 0);
   vn_u64(&e, 0); /* fence: none, a context fence on ring 1 follows */
   return vn_call(g, &e, "vkQueueSubmit");
}

/* A guest's host-visible Venus allocation, as libkrun meets it: the guest allocates
 * (vkAllocateMemory through submit_cmd), then asks for a blob of that memory
 * (RESOURCE_CREATE_BLOB with blob_id = the memory's object id), which rutabaga
 * exports at once and the VMM maps.  The harness writes through that mapping, the
 * guest's GPU queue copies the written half onto the other half, and a context fence
 * on the queue's ring says when; the copy must then be read through the mapping. */
static void
venus_memory(struct cookie *cookie, uint32_t ctx_id, struct blob *reply, const char *expect_handle)
{
   struct venus_guest g = { .ctx_id = ctx_id,
                            .reply = reply->map_ptr ? reply->map_ptr : reply->fd_map };
   const uint64_t size = 65536;
   uint32_t mem_type = 0;
   bool ok = venus_allocate(&g, reply->res_id, size, &mem_type);
   report(ok, "virgl_renderer_submit_cmd", "rutabaga virgl_renderer.rs:101",
          "Venus: vkCreateInstance, vkEnumeratePhysicalDevices, vkCreateDevice (queue on ring 1), "
          "vkAllocateMemory of %" PRIu64 " bytes, host-visible coherent type %u: %s",
          size, mem_type, ok ? "VK_SUCCESS" : g.error);
   if (!ok)
      return;

   struct blob mem = { .res_id = 2, .size = size, .fd = -1 };
   if (!create_blob(ctx_id, &mem, VN_ID_MEMORY, expect_handle, "Venus memory")) {
      destroy_blob(ctx_id, &mem);
      return;
   }
   check_views_agree(&mem);
   volatile uint32_t *view = mem.map_ptr ? mem.map_ptr : mem.fd_map;
   const uint32_t words = (uint32_t)(size / 2 / 4);
   for (uint32_t i = 0; i < words; i++) {
      view[i] = 0x6b72756e ^ i;
      view[words + i] = 0;
   }

   ok = venus_copy_halves(&g, size);
   report(ok, "virgl_renderer_submit_cmd", "rutabaga virgl_renderer.rs:101",
          "Venus: a buffer on the memory, vkCmdCopyBuffer of its first half onto the second, "
          "vkQueueSubmit: %s", ok ? "VK_SUCCESS" : g.error);
   if (ok && fence_round_trip(cookie, ctx_id, 1, 2)) {
      uint32_t bad = 0;
      for (uint32_t i = 0; i < words; i++)
         bad += view[words + i] != (0x6b72756e ^ i);
      report(bad == 0, "Venus memory (host mapping)", "gpu virtio_gpu.rs:900-926 (the guest's view of the blob)",
             "the GPU's copy of what was written through the %s: %u of %u words differ",
             mem.map_ptr ? "map pointer" : "mapped fd", bad, words);
   }
   destroy_blob(ctx_id, &mem);
}

static int
replay(const char *route, const char *expect_handle, const char *memory_handle)
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

   struct blob reply = { .res_id = 1, .size = 16384, .fd = -1 };
   if (create_blob(ctx_id, &reply, 0, expect_handle, "reply")) {
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
         /* an empty submission is valid */
         uint32_t none[1] = { 0 };
         ret = virgl_renderer_submit_cmd(none, (int)ctx_id, 0);
         report(ret == 0, "virgl_renderer_submit_cmd", "rutabaga virgl_renderer.rs:101",
                "empty Venus submission: ret %d", ret);
      }
      fence_round_trip(&cookie, ctx_id, 0, 1);
      if (!apir)
         venus_memory(&cookie, ctx_id, &reply, memory_handle);
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
   const char *expect_handle = "apple", *memory_handle = "apple";
#else
   const char *expect_handle = "shm", *memory_handle = "dmabuf";
#endif
   const char *route = NULL;
   for (int i = 1; i < argc; i++) {
      if (!strcmp(argv[i], "--expect-handle") && i + 1 < argc)
         expect_handle = argv[++i];
      else if (!strcmp(argv[i], "--expect-memory-handle") && i + 1 < argc)
         memory_handle = argv[++i];
      else if (!route && (!strcmp(argv[i], "apir") || !strcmp(argv[i], "venus")))
         route = argv[i];
      else {
         fprintf(stderr, "usage: %s apir|venus [--expect-handle TYPE] [--expect-memory-handle TYPE]\n",
                 argv[0]);
         return 2;
      }
   }
   if (!route) {
      fprintf(stderr, "usage: %s apir|venus [--expect-handle TYPE] [--expect-memory-handle TYPE]\n", argv[0]);
      return 2;
   }
   if (!strcmp(route, "apir") && !getenv("VIRGL_ROUTE_VENUS_TO_APIR")) {
      fprintf(stderr, "replay apir: set VIRGL_ROUTE_VENUS_TO_APIR=1, as the route's launcher does\n");
      return 2;
   }

   replay(route, expect_handle, memory_handle);
   printf("{\"ok\": %s, \"failures\": %d}\n", failures ? "false" : "true", failures);
   return failures ? 1 : 0;
}
