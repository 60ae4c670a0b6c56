"""Our own Triton kernels: attention for any head shape (forward and backward) and the fused attention
statistics of the analysis engine.

=========  ==========================================================================================
runtime    how a kernel is launched: compiled by Triton for CUDA tensors, run by Triton's interpreter
           (numpy, float32) for CPU tensors, so every kernel is tested on a CPU
attention  FlashAttention-style causal / sliding-window attention for ``qk_dim`` and ``v_dim`` chosen
           independently (16 ... 1024), grouped-query heads, returning the rows' log-sum-exp; the
           ``triton`` attention backend
=========  ==========================================================================================

The design (tiling, masking, backward) and measured limits are in docs/attention.md. Importing this
package does not import Triton; the modules below do.
"""
