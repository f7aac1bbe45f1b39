/* What one synchronous GPU round trip costs on a Vulkan device, waited for two ways.
 *
 * ggml-vulkan ends every graph by polling vkGetFenceStatus, and blocks in vkWaitForFences
 * after each synchronous transfer. Natively both return as soon as the GPU is done. Through
 * Mesa's venus driver each is a trip to the host and back: over vtest the fence is a vtest
 * sync, so a wait is a SYNC_WAIT on the socket and an eventfd passed back, and every poll a
 * SYNC_READ round trip. The same binary run natively and through Venus shows that cost alone,
 * without a model.
 *
 *   fence-wait [ITERATIONS]   prints one JSON line:
 *   {"device": NAME, "driver": NAME, "iterations": N, "wait_us": MEDIAN, "poll_us": MEDIAN, ...}
 *
 * Each iteration submits one command buffer holding a 4 KiB vkCmdFillBuffer (a transfer as
 * small as a token's input) with a fence, waits, resets the fence. Exit 0 only when every
 * wait saw the fence signalled and the buffer's last word holds the value of the last fill. */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vulkan/vulkan.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        VkResult r_ = (call);                                                                \
        if (r_ != VK_SUCCESS) {                                                              \
            fprintf(stderr, "fence-wait: %s failed: %d (line %d)\n", #call, r_, __LINE__);   \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

enum { FILL_BYTES = 4096 };

int main(int argc, char **argv) {
    int iterations = argc > 1 ? atoi(argv[1]) : 200;
    if (iterations < 2 || iterations > 100000) {
        fprintf(stderr, "fence-wait: ITERATIONS must be 2..100000, not %s\n", argv[1]);
        return 2;
    }

    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkInstance inst;
    CHECK(vkCreateInstance(&ici, NULL, &inst));
    uint32_t n_phys = 1;
    VkPhysicalDevice phys;
    VkResult er = vkEnumeratePhysicalDevices(inst, &n_phys, &phys);
    if ((er != VK_SUCCESS && er != VK_INCOMPLETE) || n_phys == 0) {
        fprintf(stderr, "fence-wait: no Vulkan device (%d)\n", er);
        return 2;
    }
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 props = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
    vkGetPhysicalDeviceProperties2(phys, &props);

    uint32_t n_fam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(phys, &n_fam, NULL);
    VkQueueFamilyProperties fams[16];
    n_fam = n_fam > 16 ? 16 : n_fam;
    vkGetPhysicalDeviceQueueFamilyProperties(phys, &n_fam, fams);
    uint32_t fam = UINT32_MAX;
    for (uint32_t i = 0; i < n_fam && fam == UINT32_MAX; i++)
        if (fams[i].queueFlags & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_TRANSFER_BIT))
            fam = i;
    if (fam == UINT32_MAX) {
        fprintf(stderr, "fence-wait: no compute or transfer queue\n");
        return 2;
    }
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = fam,
                                   .queueCount = 1, .pQueuePriorities = &prio};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci};
    VkDevice dev;
    CHECK(vkCreateDevice(phys, &dci, NULL, &dev));
    VkQueue queue;
    vkGetDeviceQueue(dev, fam, 0, &queue);

    /* A host-visible buffer, so the last fill can be read back and checked: system memory where the
     * device has it apart (NVIDIA's DEVICE_LOCAL|HOST_VISIBLE memory cannot be mapped through vtest). */
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = FILL_BYTES,
                              .usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT};
    VkBuffer buf;
    CHECK(vkCreateBuffer(dev, &bci, NULL, &buf));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, buf, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(phys, &mp);
    const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = UINT32_MAX;
    for (int pass = 0; pass < 2 && type == UINT32_MAX; pass++)
        for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; i++)
            if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want &&
                (pass == 1 || !(mp.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)))
                type = i;
    if (type == UINT32_MAX) {
        fprintf(stderr, "fence-wait: no host-visible coherent memory type\n");
        return 2;
    }
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size,
                                .memoryTypeIndex = type};
    VkDeviceMemory mem;
    CHECK(vkAllocateMemory(dev, &mai, NULL, &mem));
    CHECK(vkBindBufferMemory(dev, buf, mem, 0));
    volatile uint32_t *mapped;
    CHECK(vkMapMemory(dev, mem, 0, FILL_BYTES, 0, (void **) &mapped));

    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = fam};
    VkCommandPool pool;
    CHECK(vkCreateCommandPool(dev, &pci, NULL, &pool));
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cmd;
    CHECK(vkAllocateCommandBuffers(dev, &cai, &cmd));
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    CHECK(vkCreateFence(dev, &fci, NULL, &fence));

    double *wait_us = calloc(iterations, sizeof(double)), *poll_us = calloc(iterations, sizeof(double));
    if (!wait_us || !poll_us) {
        fprintf(stderr, "fence-wait: out of memory for %d timings\n", iterations);
        return 2;
    }
    long polls = 0;
    uint32_t value = 0;
    /* Alternate the two ways so both see the same load; the first round of each is a warm-up. */
    for (int i = 0; i <= iterations; i++) {
        for (int way = 0; way < 2; way++) {
            value = 0xF00D0000u + (uint32_t) (2 * i + way);
            VkCommandBufferBeginInfo cbi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                            .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
            CHECK(vkBeginCommandBuffer(cmd, &cbi));
            vkCmdFillBuffer(cmd, buf, 0, FILL_BYTES, value);
            VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                  .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                  .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
            vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL,
                                 0, NULL);
            CHECK(vkEndCommandBuffer(cmd));
            VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1,
                               .pCommandBuffers = &cmd};
            double t0 = now_us();
            CHECK(vkQueueSubmit(queue, 1, &si, fence));
            if (way == 0) {
                CHECK(vkWaitForFences(dev, 1, &fence, VK_TRUE, UINT64_MAX));
            } else {
                VkResult r;
                while ((r = vkGetFenceStatus(dev, fence)) == VK_NOT_READY) {
                    polls++;
                    sched_yield();
                }
                CHECK(r);
            }
            double dt = now_us() - t0;
            if (i > 0)
                (way == 0 ? wait_us : poll_us)[i - 1] = dt;
            if (mapped[FILL_BYTES / 4 - 1] != value) {
                fprintf(stderr, "fence-wait: after the %s the buffer holds %#x, not %#x\n",
                        way == 0 ? "wait" : "poll", mapped[FILL_BYTES / 4 - 1], value);
                return 1;
            }
            CHECK(vkResetFences(dev, 1, &fence));
            CHECK(vkResetCommandBuffer(cmd, 0));
        }
    }
    double wait_med = median(wait_us, iterations), poll_med = median(poll_us, iterations);
    double wait_p90 = wait_us[iterations * 9 / 10], poll_p90 = poll_us[iterations * 9 / 10];
    printf("{\"device\": \"%s\", \"driver\": \"%s\", \"iterations\": %d, \"wait_us\": %.1f, \"poll_us\": %.1f, "
           "\"wait_p90_us\": %.1f, \"poll_p90_us\": %.1f, \"polls_per_wait\": %.1f, \"last_value\": %u}\n",
           props.properties.deviceName, drv.driverName, iterations, wait_med, poll_med, wait_p90, poll_p90,
           (double) polls / (iterations + 1), value);

    vkDestroyFence(dev, fence, NULL);
    vkDestroyCommandPool(dev, pool, NULL);
    vkUnmapMemory(dev, mem);
    vkDestroyBuffer(dev, buf, NULL);
    vkFreeMemory(dev, mem, NULL);
    vkDestroyDevice(dev, NULL);
    vkDestroyInstance(inst, NULL);
    free(wait_us);
    free(poll_us);
    return 0;
}
