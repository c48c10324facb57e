"""uvmprefetch: transparent GPU memory oversubscription for deep learning.

Tensors live in CUDA managed memory; a prefetcher that learns the training loop's launch sequence moves
each block to the GPU before the kernel that needs it and evicts what will not be needed soon.

Layout (data flows left to right): ``trace/`` observe -> ``policy/`` decide -> ``sim/`` and ``runtime/`` act.
"""

__version__ = "0.1.0"
