/*
 * krun-gpu: a Vulkan layer that hides a driver's external-memory fd extensions, so that a Linux
 * driver behaves as MoltenVK does for vkr: host-visible memory it cannot export as an fd.
 *
 * On macOS vkr's Venus memory reaches the VMM only as its vkMapMemory pointer (darwin/0002's path);
 * lavapipe exports an opaque fd and never takes that path. Under this layer (VK_LAYER_PATH = this
 * folder, VK_INSTANCE_LAYERS=VK_LAYER_KRUN_no_external_memory) vkr sees no VK_KHR_external_memory_fd
 * and no VK_EXT_external_memory_dma_buf, and the replay's Venus allocation goes the macOS way.
 */

#include <stdlib.h>
#include <string.h>

#include <vulkan/vk_layer.h>
#include <vulkan/vulkan.h>

#define LAYER_NAME "VK_LAYER_KRUN_no_external_memory"
#define EXPORT __attribute__((visibility("default")))

static const char *const hidden[] = {
   VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME,
   VK_EXT_EXTERNAL_MEMORY_DMA_BUF_EXTENSION_NAME,
};

/* the next layer's (or the loader's) entry points: one driver, so one chain */
static PFN_vkGetInstanceProcAddr next_gipa;
static PFN_vkGetDeviceProcAddr next_gdpa;
static PFN_vkEnumerateDeviceExtensionProperties next_enumerate_device_extensions;

static VkResult VKAPI_CALL
layer_CreateInstance(const VkInstanceCreateInfo *info, const VkAllocationCallbacks *alloc,
                     VkInstance *instance)
{
   VkLayerInstanceCreateInfo *link = (VkLayerInstanceCreateInfo *)info->pNext;
   while (link && !(link->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO &&
                    link->function == VK_LAYER_LINK_INFO))
      link = (VkLayerInstanceCreateInfo *)link->pNext;
   if (!link)
      return VK_ERROR_INITIALIZATION_FAILED;

   next_gipa = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
   link->u.pLayerInfo = link->u.pLayerInfo->pNext;
   PFN_vkCreateInstance create = (PFN_vkCreateInstance)next_gipa(VK_NULL_HANDLE, "vkCreateInstance");
   VkResult result = create(info, alloc, instance);
   if (result == VK_SUCCESS)
      next_enumerate_device_extensions = (PFN_vkEnumerateDeviceExtensionProperties)next_gipa(
         *instance, "vkEnumerateDeviceExtensionProperties");
   return result;
}

static VkResult VKAPI_CALL
layer_CreateDevice(VkPhysicalDevice physical_device, const VkDeviceCreateInfo *info,
                   const VkAllocationCallbacks *alloc, VkDevice *device)
{
   VkLayerDeviceCreateInfo *link = (VkLayerDeviceCreateInfo *)info->pNext;
   while (link && !(link->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO &&
                    link->function == VK_LAYER_LINK_INFO))
      link = (VkLayerDeviceCreateInfo *)link->pNext;
   if (!link)
      return VK_ERROR_INITIALIZATION_FAILED;

   PFN_vkGetInstanceProcAddr gipa = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
   next_gdpa = link->u.pLayerInfo->pfnNextGetDeviceProcAddr;
   link->u.pLayerInfo = link->u.pLayerInfo->pNext;
   PFN_vkCreateDevice create = (PFN_vkCreateDevice)gipa(VK_NULL_HANDLE, "vkCreateDevice");
   return create(physical_device, info, alloc, device);
}

static int
is_hidden(const char *name)
{
   for (size_t i = 0; i < sizeof(hidden) / sizeof(hidden[0]); i++) {
      if (!strcmp(name, hidden[i]))
         return 1;
   }
   return 0;
}

static VkResult VKAPI_CALL
layer_EnumerateDeviceExtensionProperties(VkPhysicalDevice physical_device, const char *layer,
                                         uint32_t *count, VkExtensionProperties *props)
{
   if (layer && !strcmp(layer, LAYER_NAME)) {
      *count = 0;
      return VK_SUCCESS;
   }
   uint32_t all = 0;
   VkResult result = next_enumerate_device_extensions(physical_device, layer, &all, NULL);
   if (result != VK_SUCCESS)
      return result;
   VkExtensionProperties *list = calloc(all ? all : 1, sizeof(*list));
   if (!list)
      return VK_ERROR_OUT_OF_HOST_MEMORY;
   result = next_enumerate_device_extensions(physical_device, layer, &all, list);
   uint32_t kept = 0;
   for (uint32_t i = 0; result == VK_SUCCESS && i < all; i++) {
      if (!is_hidden(list[i].extensionName))
         list[kept++] = list[i];
   }
   if (result == VK_SUCCESS) {
      if (!props) {
         *count = kept;
      } else {
         uint32_t n = *count < kept ? *count : kept;
         memcpy(props, list, n * sizeof(*list));
         result = n < kept ? VK_INCOMPLETE : VK_SUCCESS;
         *count = n;
      }
   }
   free(list);
   return result;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkGetDeviceProcAddr(VkDevice device, const char *name);

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL
vkGetInstanceProcAddr(VkInstance instance, const char *name)
{
   if (!strcmp(name, "vkGetInstanceProcAddr"))
      return (PFN_vkVoidFunction)vkGetInstanceProcAddr;
   if (!strcmp(name, "vkGetDeviceProcAddr"))
      return (PFN_vkVoidFunction)vkGetDeviceProcAddr;
   if (!strcmp(name, "vkCreateInstance"))
      return (PFN_vkVoidFunction)layer_CreateInstance;
   if (!strcmp(name, "vkCreateDevice"))
      return (PFN_vkVoidFunction)layer_CreateDevice;
   if (!strcmp(name, "vkEnumerateDeviceExtensionProperties"))
      return (PFN_vkVoidFunction)layer_EnumerateDeviceExtensionProperties;
   return next_gipa ? next_gipa(instance, name) : NULL;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL
vkGetDeviceProcAddr(VkDevice device, const char *name)
{
   if (!strcmp(name, "vkGetDeviceProcAddr"))
      return (PFN_vkVoidFunction)vkGetDeviceProcAddr;
   return next_gdpa ? next_gdpa(device, name) : NULL;
}
