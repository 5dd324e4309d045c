"""The peak resident size of a benchmark's child process, as source the child runs (``python -c``): ``PEAK_KB``
defines ``peak_kb()``, in kB. ``VmHWM`` from /proc/self/status where there is one: ``ru_maxrss`` survives execve on
Linux (it starts at the forking parent's size), VmHWM is this process image's alone; ``ru_maxrss`` elsewhere."""

PEAK_KB = r"""
def peak_kb():
    import resource
    kb = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    kb = int(line.split()[1])
    except OSError:
        pass
    return kb if kb is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""
