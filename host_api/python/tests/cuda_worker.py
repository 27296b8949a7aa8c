"""One CUDA oracle run in its own process (torch's allocator is replaced once
per process, and one plugin context serves it): argv = model kind, INI path.
Trains the seeded model in plain PyTorch on the device, then through the
plugin, and prints one JSON line with the losses, the relative weight error
and the plugin's counters."""
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import torch  # noqa: E402

import oracle  # noqa: E402
import protrain.torch as ptt  # noqa: E402
from protrain import _cuda  # noqa: E402


def main(kind, ini):
    ptt.init(ini)
    sess = _cuda.session()
    dev = sess.device
    # every torch CUDA allocation is the plugin's: 1 MiB shows in its counters
    before = sess.ctx.stats().dev_current
    probe = torch.empty(1 << 18, dtype=torch.float32, device=dev)
    routed = sess.ctx.stats().dev_current - before
    del probe
    m = oracle.make_model(kind)
    ref = copy.deepcopy(m).to(dev)
    data = oracle.batches(oracle.STEPS)
    want = oracle.reference(ref, [x.to(dev) for x in data])
    ref_sd = {k: v.detach().cpu() for k, v in ref.state_dict().items()}
    del ref
    model, got = oracle.through_plugin(m, ini, [x.to(dev) for x in data])
    torch.cuda.synchronize(dev)
    sd = {k: v.cpu() for k, v in ptt.state_dict(model).items()}
    st = ptt.stats(model)
    print(json.dumps(dict(got=got, want=want, err=oracle.rel_norm(sd, ref_sd), routed=routed,
                          dev_peak=st.dev_peak, pred_peak=st.pred_peak,
                          failures=sess.shim.failures())), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
