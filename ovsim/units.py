"""Unit constants. Inside ovsim every quantity is SI (seconds, bytes, FLOP, hertz, watts);
multiply by these constants at the edges, where humans and file formats speak other units."""

NS = 1e-9
US = 1e-6
MS = 1e-3

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KIB = 1024
MIB = 1024**2
GIB = 1024**3

MHZ = 1e6
GHZ = 1e9

TFLOPS = 1e12
GB_PER_S = 1e9
TB_PER_S = 1e12

BYTES_PER_ELEMENT = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
}
