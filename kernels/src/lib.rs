//! kernels (being written)
