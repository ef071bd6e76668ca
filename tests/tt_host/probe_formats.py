"""Run by the ttnn venv under a mock cluster descriptor: tt-metal's own host conversion
(``ttnn.from_torch`` to a TILE tensor, ``ttnn.to_torch`` back) against ``round_to`` of
``tt_serve.model.formats``, bit for bit, on inputs chosen to hit every branch of the block-float
packer. Prints "TTNN_PROBE_RESULT " + JSON {"cases": [{"name", "dtype", "n", "diff", "first"}]}."""

import json

import torch
import ttnn

from tt_serve.model.formats import round_to

DTYPES = {"bfloat16": ttnn.bfloat16, "bfloat8_b": ttnn.bfloat8_b, "bfloat4_b": ttnn.bfloat4_b}


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = torch.randn(64, 128, generator=g)
    # mixed exponents inside one face row: each row spans 2^-40 .. 2^40
    mixed = n * torch.exp2(torch.randint(-40, 40, (64, 128), generator=g).float())
    # ties: values exactly halfway between two bfloat8_b / bfloat4_b magnitudes of a row whose
    # shared exponent is set by a leading 1.0
    ties = torch.ones(32, 64)
    steps = torch.arange(1, 64 * 32 + 1, dtype=torch.float32).reshape(32, 64)
    ties[:, 1::2] = (steps[:, 1::2] % 128 + 0.5) / 64.0
    sub = torch.randn(32, 32, generator=g) * 1e-39  # float32 subnormals (exponent field 0)
    sub[:, :8] *= 1e6  # next to small normals
    near_max = 1.0 - torch.rand(32, 64, generator=g) * 2**-9  # rounding carries to the clamp
    zero_tile = torch.zeros(64, 64)
    zero_tile[32:, :] = torch.randn(32, 64, generator=g)
    signed_zero = torch.randn(32, 32, generator=g)
    signed_zero[:, ::3] = -0.0
    # shared exponents near the bottom of the range, where the read-back exponent can underflow
    tiny = {
        f"tiny_2^{k}": torch.randn(32, 32, generator=g) * 2.0**k for k in (-118, -122, -126, -130)
    }
    return tiny | {
        "normal": n,
        "heavy_tailed": torch.distributions.StudentT(1.5).sample((96, 64)) * 0.02,
        "mixed_exponents": mixed,
        "ties": ties,
        "subnormal": sub,
        "tiny_shared_exponent": torch.randn(32, 32, generator=g) * 2**-124,
        "near_max": near_max,
        "all_zero_tile": zero_tile,
        "signed_zero": signed_zero,
        "unaligned_3x5": torch.randn(3, 5, generator=g),
        "unaligned_33x47": torch.randn(33, 47, generator=g) * 10,
        "unaligned_batch_2x7x40": torch.randn(2, 7, 40, generator=g),
        "bf16_ties": (torch.arange(1024, dtype=torch.float32) * 2**-16 + 1.0).reshape(32, 32),
    }


cases = []
for name, x in inputs().items():
    for dname, dt in DTYPES.items():
        theirs = ttnn.to_torch(ttnn.from_torch(x, dtype=dt, layout=ttnn.TILE_LAYOUT)).float()
        ours = round_to(x, dname)
        a, b = theirs.contiguous().view(torch.int32), ours.contiguous().view(torch.int32)
        bad = (a != b).nonzero()
        first = None
        if len(bad):
            i = tuple(bad[0].tolist())
            first = [list(i), float(x[i]), float(theirs[i]), float(ours[i])]
        changed = int((ours.view(torch.int32) != x.contiguous().view(torch.int32)).sum())
        cases.append(
            {
                "name": name,
                "dtype": dname,
                "n": x.numel(),
                "shape_ok": list(theirs.shape) == list(x.shape),
                "diff": len(bad),
                "changed": changed,
                "first": first,
            }
        )
print("TTNN_PROBE_RESULT " + json.dumps({"cases": cases}))
