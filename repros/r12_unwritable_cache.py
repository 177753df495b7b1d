"""TORCHINDUCTOR_CACHE_DIR that cannot be created (a path under a regular file; root ignores
permission bits): what plain Inductor and compiler="inductor" do."""

import os
import sys
import tempfile

blocker = tempfile.NamedTemporaryFile(delete=False)
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(blocker.name, "cache")
import torch  # noqa: E402

import msched  # noqa: E402


class TwoBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x).relu() + self.b(x).sin()


which = sys.argv[1] if len(sys.argv) > 1 else "inductor"
b = "inductor" if which == "plain" else msched.backend(num_streams=2, compiler="inductor")
try:
    with torch.no_grad():
        torch.compile(TwoBranches(), backend=b)(torch.randn(4, 8))
    print(which, "compiled")
except Exception as e:
    inner = getattr(e, "inner_exception", e)
    print(which, type(e).__name__, type(inner).__name__, str(inner).strip()[:300])
