// A GPU context's first kernel launch, made on purpose. The first launch in a
// context does setup that waits for the whole GPU (measured on H200 under
// CUDA 13, with CUDA_MODULE_LOADING=EAGER as well as lazy): while a stream
// waits on a word that a copy engine's later work would release, a first
// launch there holds every copy submitted after it, so the release never
// comes. Code that makes streams wait so (the multipath engine's gates) makes
// this launch first, once per GPU; its own copies launch nothing.
#pragma once

namespace ferry {
namespace dma {

// Launches one empty kernel (one thread) on `device` and waits for it. Once
// per process and GPU; later calls return at once. Raises a CUDA error.
void complete_first_launch(int device);

}  // namespace dma
}  // namespace ferry
