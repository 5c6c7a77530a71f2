"""Bounds shared by the config sections: the largest values a key may take, each with the reason."""

# The longest wait any timeout may ask for. The operating system's poll, which the reward processes are waited
# on with, takes at most 2**31 - 1 milliseconds (24.8 days); a round bound below it, for every timeout alike.
MAX_WAIT_S = 1e6
# The largest KV-cache block. Larger blocks decode no faster (the Triton kernel's largest tile is 512
# positions, at head dimension 16; the CUDA kernel's is 16) and waste KV memory, since every sequence holds
# whole blocks: a huge one leaves no block at all within the cache budget, which an engine finds only once
# it starts.
MAX_BLOCK_SIZE = 512
# Seeds: numpy takes non-negative ones only; the trainer derives per-step seeds as seed x 100019 + step,
# which stays within torch's 64 bits below this bound.
MAX_SEED = 2**32 - 1
# Memory limits become bytes for setrlimit, a signed 64-bit number; 2**30 MiB (1 PiB) is far below it.
MAX_MEMORY_MB = 2**30
