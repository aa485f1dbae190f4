"""Map the GPU name a trace reports (Kineto ``deviceProperties[].name``, nsys ``TARGET_INFO_GPU``) to
an ovsim GPU spec.

The names drivers report come first from the spec files' ``aliases`` (so a spec a user adds under
``OVSIM_SPEC_PATH`` is found the same way), then from the few spellings below that no spec lists.
A name that matches neither gives None: a PCIe, NVL or MIG variant of a known part has other clocks,
power or SM counts, and taking the SXM spec for it would be a silent wrong answer.
"""

from __future__ import annotations

from ovsim.errors import OvsimError
from ovsim.hw.spec import gpu_file

# Reported spellings (alphanumerics only, lower case) that no spec file's aliases cover.
_EXTRA = {
    # ROCm 5/6 reports both MI250 variants under one name; each GCD is one device.
    "amdinstinctmi250xmi250": "mi250x-gcd",
    # SR-IOV virtual function of an MI300X (cloud VMs): the same silicon.
    "amdinstinctmi300xvf": "mi300x",
}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def spec_for_device_name(name: str) -> str | None:
    """The ovsim GPU spec name (file stem, e.g. ``a100-sxm4-40gb``) for a reported device name, or None."""
    text = name.strip()
    if not text:
        return None
    extra = _EXTRA.get(_norm(text))
    if extra is not None:
        return extra
    # gpu_file treats a name ending in .yaml as a path; a device name never does.
    if text.lower().endswith((".yaml", ".yml")):
        return None
    try:
        return gpu_file(text).stem
    except OvsimError:
        return None
