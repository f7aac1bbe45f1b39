/*
 * krun-gpu: the Venus half of the replay, as a Vulkan client sees it.
 *
 * Run with Mesa's venus driver over vtest (VN_DEBUG=vtest, the virtio ICD) against the tree's
 * virgl_test_server started without --render-server, so vkr runs in the server's own process
 * (our in-process contexts). Lists the physical devices, then allocates one host-visible block,
 * maps it, writes and reads it back. Exit 0 only when a device is listed and the mapping holds.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
      printf("device %u: %s (driver 0x%x)\n", i, props.deviceName, props.driverVersion);
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

   VkPhysicalDeviceMemoryProperties mem;
   vkGetPhysicalDeviceMemoryProperties(devices[0], &mem);
   uint32_t type = UINT32_MAX;
   const VkMemoryPropertyFlags want =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
   for (uint32_t i = 0; i < mem.memoryTypeCount && type == UINT32_MAX; i++) {
      if ((mem.memoryTypes[i].propertyFlags & want) == want)
         type = i;
   }
   if (type == UINT32_MAX) {
      fprintf(stderr, "vkprobe: no host-visible coherent memory type\n");
      return 1;
   }

   const VkDeviceSize size = 1 << 20;
   VkMemoryAllocateInfo mai = { .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .allocationSize = size,
                                .memoryTypeIndex = type };
   VkDeviceMemory memory;
   CHECK(vkAllocateMemory(device, &mai, NULL, &memory));
   void *ptr = NULL;
   CHECK(vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, &ptr));
   memset(ptr, 0x5a, size);
   int same = ((unsigned char *)ptr)[size - 1] == 0x5a;
   vkUnmapMemory(device, memory);
   CHECK(vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, &ptr));
   same = same && ((unsigned char *)ptr)[size / 2] == 0x5a;
   vkUnmapMemory(device, memory);
   printf("host-visible allocation: type %u, %llu bytes, mapped: %s\n", type, (unsigned long long)size,
          same ? "yes" : "NO");

   vkFreeMemory(device, memory, NULL);
   vkDestroyDevice(device, NULL);
   vkDestroyInstance(instance, NULL);
   return same ? 0 : 1;
}
