"""AMD ROCm (roctracer): HIP launches on the host, copies (also as kernels) and RCCL on GPU streams."""

from analysis.producers import Producer

PRODUCER = Producer(
    name="rocm",
    launch=r"^hip(?:Ext)?(?:Module)?LaunchKernel\w*$|^hipLaunchCooperativeKernel\w*$|^hipGraphLaunch$",
    device_input=r"^CopyHostToDevice",
    # Copies and fills that the runtime runs as kernels count as copies, not compute.
    device_copy=r"^(?:CopyDeviceToDevice|CopyDeviceToHost|CopyPeer|FillBuffer)|^__amd_rocclr_(?:copy|fill)",
    collective=r"rccl",
    device_to_host=r"^CopyDeviceToHost",
)
