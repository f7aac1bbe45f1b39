/*
 * krun-gpu: a Vulkan client's first look at a Venus context made in process.
 *
 * Run with Mesa's venus driver over vtest (VN_DEBUG=vtest, the virtio ICD) against the darwin
 * tree's virgl_test_server --venus-in-process (darwin/0006), so vkr runs in the server's own
 * process as it runs in krunkit's. Lists the physical devices and creates a device with one queue
 * on the first, then destroys both: the instance, device and queue commands (and the instance's
 * ring teardown, which waits on a CPU-timeline fence) all go through the in-process context.
 * Exit 0 only when a device is listed, created and destroyed with its instance.
 *
 * Host-visible memory is not probed here: vtest hands a mapping to another process as an fd, and a
 * driver's exported fd is not what krunkit maps (it maps the pointer darwin/0002 exports); the
 * replay harness (replay.c) allocates, exports and maps Venus memory the way libkrun does.
 */

#include <stdio.h>
#include <stdlib.h>

#include <vulkan/vulkan.h>

#define CHECK(call)                                                                      \
   do {                                                                                  \
      VkResult r_ = (call);                                                              \
      if (r_ != VK_SUCCESS) {                                                            \
         fprintf(stderr, "vkprobe: %s failed: %d\n", #call, r_);                         \
         return 1;                                                                       \
      }                                                                                  \
   } while (0)

int
main(void)
{
   /* a timeout may end this process: what was printed must be there */
   setvbuf(stdout, NULL, _IONBF, 0);

   VkApplicationInfo app = { .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "krun-vkprobe",
                             .apiVersion = VK_API_VERSION_1_1 };
   VkInstanceCreateInfo ici = { .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app };
   VkInstance instance;
   CHECK(vkCreateInstance(&ici, NULL, &instance));

   uint32_t count = 0;
   CHECK(vkEnumeratePhysicalDevices(instance, &count, NULL));
   if (!count) {
      fprintf(stderr, "vkprobe: no physical device\n");
      return 1;
   }
   VkPhysicalDevice devices[8];
   count = count > 8 ? 8 : count;
   CHECK(vkEnumeratePhysicalDevices(instance, &count, devices));
   for (uint32_t i = 0; i < count; i++) {
      VkPhysicalDeviceProperties props;
      vkGetPhysicalDeviceProperties(devices[i], &props);
      printf("device %u: %s (api %u.%u)\n", i, props.deviceName, VK_API_VERSION_MAJOR(props.apiVersion),
             VK_API_VERSION_MINOR(props.apiVersion));
   }

   float priority = 1.0f;
   VkDeviceQueueCreateInfo qci = { .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                   .queueFamilyIndex = 0,
                                   .queueCount = 1,
                                   .pQueuePriorities = &priority };
   VkDeviceCreateInfo dci = { .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                              .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci };
   VkDevice device;
   CHECK(vkCreateDevice(devices[0], &dci, NULL, &device));
   VkQueue queue;
   vkGetDeviceQueue(device, 0, 0, &queue);
   CHECK(vkQueueWaitIdle(queue));
   printf("device created, queue idle\n");

   vkDestroyDevice(device, NULL);
   vkDestroyInstance(instance, NULL);
   printf("device and instance destroyed\n");
   return 0;
}
