"""Refusals (one sentence each) and the negative controls: the adapter's two
orderings are what make the oracle pass, so removing either makes it fail."""
import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import CKPT, STREAMED, check


class NoBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.net(x)


class Twice(torch.nn.Module):
    """Calls block 0 twice in one forward."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    def forward(self, x):
        x = self.blocks[0](x)
        x = self.blocks[0](x)
        return self.blocks[1](x).sum()


class Shared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
        self.blocks[1].weight = self.blocks[0].weight


def test_no_recognisable_blocks(ini, plugin_path):
    with pytest.raises(ValueError, match="no recognisable blocks in NoBlocks .*pass blocks="):
        ptt.wrap(NoBlocks(), config=ini(), plugin=plugin_path)


def test_ddp_wrapped(ini, plugin_path, tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "pg"), rank=0,
                            world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(oracle.make_model("gpt2"))
        with pytest.raises(ValueError, match="wrapped in DistributedDataParallel; the plugin "
                                             "synchronises gradients"):
            ptt.wrap(ddp, config=ini(), plugin=plugin_path)
    finally:
        dist.destroy_process_group()


def test_block_called_twice(ini, plugin_path):
    m = Twice()
    m, opt = ptt.wrap(m, config=ini(), blocks=m.blocks, plugin=plugin_path)
    with pytest.raises(RuntimeError, match="block 0 was called twice in one forward"):
        m(torch.randn(2, 8))


def test_parameter_in_two_blocks(ini, plugin_path):
    m = Shared()
    with pytest.raises(ValueError, match="is used by blocks 0, 1"):
        ptt.wrap(m, config=ini(), blocks=m.blocks, plugin=plugin_path)


def test_kv_cache_in_training(ini, plugin_path):
    """use_cache=True is turned off in training passes (test_cache.py); a
    cache passed in is refused. The control: with use_cache kept, the
    transformers default makes a cache and the block refuses it."""
    from transformers import DynamicCache
    m = oracle.make_model("llama")
    m.config.use_cache = True
    m, opt = ptt.wrap(m, config=ini(), plugin=plugin_path)
    x = oracle.batches(2)
    m(input_ids=x[0], labels=x[0]).loss.backward()
    opt.step()
    with pytest.raises(RuntimeError, match="got a KV cache .* pass no past_key_values"):
        m(input_ids=x[1], labels=x[1], cache=DynamicCache())
    m2, opt2 = ptt.wrap(oracle.make_model("llama"), config=ini(), plugin=plugin_path)
    m2.config.use_cache = True
    m2._protrain.keep_cache = True
    with pytest.raises(RuntimeError, match="got a KV cache"):
        m2(input_ids=x[0], labels=x[0])


def _fails(kind, path, plugin_path, setup):
    """How the oracle pair failed: None when it passed, else (how, sentence)
    with how "oracle" (it trained, and its losses or weights left plain
    PyTorch's: check's assertion) or "error" (the run raised). Each control
    says which it expects and what the sentence must say, so a control that
    fails for an unrelated reason (a crash elsewhere, a refusal) does not pass."""
    try:
        got, want, err, _ = oracle.pair(kind, path, plugin_path, setup=setup)
    except RuntimeError as e:
        return ("error", str(e))
    try:
        check(got, want, err)
    except AssertionError as e:
        return ("oracle", str(e))
    return None


# What releasing a block at its first accumulated gradient does to the rest of
# its backward: GPT-2's remaining nodes read a parameter whose storage was
# already given back, i.e. the placeholder a parameter holds outside its
# windows (its shape, every element NaN), so its gradients and then the
# weights turn NaN and the oracle sees "nan" where plain PyTorch has a loss;
# Llama's read a saved view outside the block's window, which the adapter's
# guard names.
EARLY = {"gpt2": ("oracle", "nan vs"),
         "llama": ("error", "was used outside its backward window")}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_control_post_backward_without_waiting(kind, ini, plugin_path):
    """block_post_backward at the block's first accumulated gradient (not after
    all of them and after the gradient has left the block): the pass fails the
    way EARLY says; the same configuration with the wait passes."""
    def setup(m):
        m._protrain.skip_post_backward_wait = True
    got = _fails(kind, ini(STREAMED), plugin_path, setup)
    how, text = EARLY[kind]
    assert got is not None and got[0] == how and text in got[1], got
    assert _fails(kind, ini(STREAMED), plugin_path, None) is None


def test_control_post_backward_at_the_last_gradient(ini, plugin_path):
    """block_post_backward as soon as the block's gradient count completes,
    without waiting for the gradient to leave the block: Llama's RMSNorm weight
    gradient lands before the norm's remaining backward nodes, which still read
    the block's saved tensors, so the pass fails (GPT-2's LayerNorm computes all
    its gradients in one node and would not show it). Every block CKPT, so the
    saved tensors are read from the arena: a NONE block's stay autograd's,
    which closing the window does not take away. The same configuration without
    the fault passes."""
    def setup(m):
        m._protrain.post_backward_at_count = True
    got = _fails("llama", ini(CKPT), plugin_path, setup)
    assert got is not None and got[0] == "error" and "used outside its backward window" in got[1], got
    assert _fails("llama", ini(CKPT), plugin_path, None) is None


# A block's chunks take 4 buffers in GPT-2 and 6 in Llama at chunk_size 128KiB:
# with one and a half blocks' worth the slots rotate, so a block's chunks sit at
# other addresses in its backward than in its forward. (With exactly one block's
# worth every block lands in the same slots and a stale address happens to be
# refilled with the right chunk, which is why the control names the buffers.)
ROTATING = {"gpt2": 6, "llama": 9}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_control_no_rebind_at_backward(kind, ini, plugin_path):
    """Backward keeps the parameter views its forward had instead of rebinding
    .data at block_pre_backward: with rotating buffer slots those addresses
    hold other chunks by then, and the oracle fails; the same configuration
    with the rebinding passes."""
    path = ini(STREAMED.replace("n_buffer = 6", "n_buffer = %d" % ROTATING[kind]))

    def setup(m):
        m._protrain.skip_rebind = True
    got = _fails(kind, path, plugin_path, setup)
    # it trains, on other chunks' values: the losses leave plain PyTorch's
    # from step 2 (step 1's forward precedes any backward)
    assert got is not None and got[0] == "oracle" and got[1].startswith("step 2:"), got
    assert _fails(kind, path, plugin_path, None) is None


def test_step_and_pass_order(ini, plugin_path):
    """optimizer.step() before grad_accum passes is refused with a sentence; a
    training forward without its backward drops its step with a warning."""
    m, opt = ptt.wrap(oracle.make_model("gpt2"), config=ini(), grad_accum=2, plugin=plugin_path)
    x = oracle.batches(1)[0]
    m(input_ids=x, labels=x).loss.backward()
    with pytest.raises(RuntimeError, match="optimizer.step\\(\\) after 1 forward/backward "
                                           "passes; grad_accum = 2"):
        opt.step()
    # a forward whose loss is dropped: the next forward drops the step (both
    # micro-batches) with a warning and starts it again
    m(input_ids=x, labels=x)
    with pytest.warns(RuntimeWarning, match="loss was never back-propagated.*step 1 was dropped "
                                            "\\(2 micro-batch"):
        m(input_ids=x, labels=x).loss.backward()
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    assert ptt.stats(m).steps == 1
