# SPDX-License-Identifier: Apache-2.0
# Python half of PCP's IREE backend. Embedded into the pcp binary at build time
# and executed inside the worker's own interpreter (never as a script). It does
# set-up work (devices, program loading, downloads); the per-call path
# (argument lists, invoke, results) is driven from C on the objects returned
# here, so no Python bytecode runs per invocation.
#
# Only the compiled extension is imported, not the `iree.runtime` package:
# its Python layer (function invokers, array interop, tracing) is unused here
# and costs about 10 MB of RSS per process.
import re

from iree._runtime_libs import _runtime as B
import numpy as np  # already loaded by the extension itself

U8 = np.dtype(np.uint8)
DEVICE_LOCAL = int(B.MemoryType.DEVICE_LOCAL)
USAGE_DEFAULT = int(B.BufferUsage.DEFAULT)

# PCP element type number -> IREE HAL element type (see base.h).
ELEMENT_TYPES = {
    1: int(B.HalElementType.FLOAT_32),
    2: int(B.HalElementType.FLOAT_16),
    3: int(B.HalElementType.BFLOAT_16),
    4: int(B.HalElementType.FLOAT_64),
    5: int(B.HalElementType.BOOL_8),
    6: int(B.HalElementType.SINT_8),
    7: int(B.HalElementType.SINT_16),
    8: int(B.HalElementType.SINT_32),
    9: int(B.HalElementType.SINT_64),
    10: int(B.HalElementType.UINT_8),
    11: int(B.HalElementType.UINT_16),
    12: int(B.HalElementType.UINT_32),
    13: int(B.HalElementType.UINT_64),
}
# Results may come back signless (INT_32) or signed; both map to PCP's iN.
RESULT_TYPES = {v: k for k, v in ELEMENT_TYPES.items()}
for bits, pcp in ((8, 6), (16, 7), (32, 8), (64, 9)):
    RESULT_TYPES[int(getattr(B.HalElementType, "INT_%d" % bits))] = pcp
RESULT_TYPES[int(B.HalElementType.INT_8)] = 6


def set_flags(*flags):
    B.parse_flags(*flags)


class Backend:
    """One device with its VM instance and HAL module."""

    def __init__(self, device):
        self.instance = B.VmInstance()
        self.hal_module = B.create_hal_module(self.instance, device)


def create_device(driver, ordinal):
    """Returns (device, backend, name)."""
    if driver in ("local-task", "local-sync"):
        if ordinal != 0:
            raise LookupError(
                "driver %s has one device (ordinal 0), not %d" % (driver, ordinal))
        device = B.get_cached_hal_driver(driver).create_device_by_uri(driver)
        name = driver
    else:
        try:
            drv = B.get_cached_hal_driver(driver)
            infos = drv.query_available_devices()
        except Exception as e:  # driver library missing, no GPU, ...
            raise ConnectionError(
                "the %s driver cannot start here: %s" % (driver, e)) from None
        if ordinal < 0 or ordinal >= len(infos):
            raise LookupError("no %s device %d (%d present)" % (driver, ordinal, len(infos)))
        device = drv.create_device(infos[ordinal])
        name = str(infos[ordinal].get("name", driver))
    return device, Backend(device), name


_CC = re.compile(r"\((\d*)([a-zA-Z]*)_([a-zA-Z]*)\)")


class Program:
    def __init__(self, backend, data):
        self.module = B.VmModule.copy_buffer(backend.instance, data)
        self.vm_context = B.VmContext(
            backend.instance, modules=[backend.hal_module, self.module])
        self.names = [n for n in self.module.function_names if not n.startswith("__")]

    def lookup(self, name):
        """Returns (function, declaration, input_count, result_count)."""
        fn = None
        if name in self.names:
            fn = self.module.lookup_function(name)
        if fn is None:
            raise LookupError(
                "no function '%s' in the program (exported: %s)"
                % (name, ", ".join(self.names) or "none"))
        decl = fn.reflection.get("iree.abi.declaration", "")
        m = _CC.search(repr(fn))
        if not m:
            raise RuntimeError("cannot read the calling convention of %r" % fn)
        return fn, decl, len(m.group(2)), len(m.group(3))


def upload(device, memory, shape, element_type):
    buffer = device.allocator.allocate_buffer_copy(
        DEVICE_LOCAL, USAGE_DEFAULT, device, memory)
    return B.HalBufferView(buffer, shape, element_type)


def memory(device):
    """(has statistics, device bytes allocated, freed, peak) of |device|'s
    allocator (IREE counts every buffer it allocates and frees)."""
    alloc = device.allocator
    if not alloc.has_statistics:
        return (False, 0, 0, 0)
    s = alloc.statistics
    return (True, int(s["device_bytes_allocated"]),
            int(s["device_bytes_freed"]), int(s["device_bytes_peak"]))


def describe(view):
    """(pcp element type, shape list, byte length) of a result."""
    return RESULT_TYPES.get(int(view.element_type), 0), list(view.shape), view.byte_length


def download(device, view, out):
    """Copies |view| into the writable buffer |out| (same byte length)."""
    target = np.frombuffer(out, dtype=U8)
    try:
        mapped = view.map()
        target[:] = mapped.asarray([view.byte_length], U8)
        return
    except Exception:  # noqa: BLE001 - not host-mappable: DMA below
        pass
    source = view.get_buffer()
    alloc = device.allocator
    staging = alloc.allocate_buffer(
        memory_type=int(B.MemoryType.HOST_LOCAL | B.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(B.BufferUsage.TRANSFER_TARGET | B.BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length())
    sem = device.create_semaphore(0)
    device.queue_copy(source, staging,
                      wait_semaphores=B.HalFence.create_at(sem, 0),
                      signal_semaphores=B.HalFence.create_at(sem, 1))
    B.HalFence.create_at(sem, 1).wait()
    target[:] = staging.map().asarray([view.byte_length], U8)
