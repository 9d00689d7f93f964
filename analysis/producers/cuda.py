"""NVIDIA CUDA (CUPTI): kernel launches on the host, copies and NCCL on GPU stream lines."""

from analysis.producers import Producer

PRODUCER = Producer(
    name="cuda",
    launch=r"^(?:cuLaunchKernel\w*|cudaLaunchKernel\w*|cuLaunchCooperativeKernel\w*|cudaLaunchCooperativeKernel\w*"
    r"|cuGraphLaunch|cudaGraphLaunch)$",
    device_input=r"^(?:MemcpyHtoD|Memcpy H2D|MemcpyH2D)",
    device_copy=r"^(?:MemcpyDtoH|MemcpyDtoD|MemcpyPtoP|Memcpy D2H|Memcpy D2D|Memcpy P2P|MemcpyD2H|MemcpyD2D|Memset)",
    collective=r"nccl",
    device_to_host=r"^(?:MemcpyDtoH|Memcpy D2H|MemcpyD2H)",
)
