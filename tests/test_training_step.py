"""The pretraining step as a GPU runs it: one compiled graph with shapes fixed by the batch's, no reads
back to the host between log steps, and int8-simulated layers that keep int8's arithmetic under
autocast. Proven on CPU: dynamo's eager backend traces the graph without generating code, and a
dispatch mode sees every operation whose result the host would have to wait for."""

import pytest
import torch
from test_pretrain import tiny_args

from benchmarks.speed.host_reads import HostReads
from training.embedding_grad import opaque_embedding_grads
from training.pretraining.masking import draw_noise
from training.pretraining.start import setup

# Every corruption a run can ask for: each row its own rate, content words masked more, punctuation
# protected, word swaps from a table beside the generator's samples.
CORRUPTIONS = ("--row-mask-spread", "0.5", "--content-mask-weight", "2", "--no-corrupt-punctuation",
               "--word-swap-prob", "0.3", "--word-swap-kinds", "random,frequency")  # fmt: skip


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, small_corpus, small_tokenizer, registry_data):
    out = tmp_path_factory.mktemp("step") / "run"
    return setup(tiny_args(out, small_corpus, small_tokenizer, "--data-dir", registry_data, *CORRUPTIONS))


def test_steps_between_log_steps_never_wait_for_the_device(trainer):
    trainer.train_step()  # the first step allocates optimizer state
    with HostReads() as reads:
        for _ in range(3):
            sums, norm = trainer.train_step()
    assert reads.seen == []
    assert trainer.settle_tokens() > 0 and all(torch.isfinite(v) for v in sums.values())


def micro_batches(t, n: int):
    for i in range(n):
        batch = next(t.data.train)
        yield batch, draw_noise(tuple(batch["input_ids"].shape), 0, i, slice(None), "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["electra", "mlm"])
def test_the_step_compiles_to_one_graph_that_never_recompiles(trainer, tmp_path, small_corpus, small_tokenizer,
                                                              objective):  # fmt: skip
    t = trainer if objective == "electra" else setup(tiny_args(tmp_path / "mlm", small_corpus, small_tokenizer,
                                                               "--objective", "mlm"))  # fmt: skip
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = torch.compile(t.objective, fullgraph=True, backend="eager")  # fullgraph: a break raises
    for padded in (False, True):
        for batch, noise in micro_batches(t, 3):
            out = step(batch, noise, padded=padded)
            t.objective.loss(out, out.n_masked, out.n_tokens).loss.backward()
    # One graph for unpadded batches and one for padded ones; new data of the same shape reuses them.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


@pytest.mark.slow
def test_a_quantization_aware_step_compiles_to_one_graph(tmp_path, small_corpus, small_tokenizer):
    t = setup(tiny_args(tmp_path / "qat", small_corpus, small_tokenizer, "--qat"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = torch.compile(t.objective, fullgraph=True, backend="eager")
    for batch, noise in micro_batches(t, 3):
        out = step(batch, noise)
        t.objective.loss(out, out.n_masked, out.n_tokens).loss.backward()
    # fullgraph catches breaks, not recompiles: the int8 layers' ranges and counts stay out of the guards.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_int8_simulated_layers_keep_fp32_arithmetic_under_autocast():
    """Autocast would round the fake-quantized operands of F.linear to bf16; the bundle multiplies int8
    values exactly and scales in fp32. The layer's output must not change under autocast."""
    from training.quantization import Int8Linear

    torch.manual_seed(0)
    layer = Int8Linear(64, 32)
    layer.set_range(0.02, 3)
    x = torch.randn(8, 64)
    plain = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = layer(x)
    assert under_autocast.dtype == torch.float32
    assert torch.equal(plain, under_autocast)


def backward_graph_ops(objective, batch, noise) -> list:
    """The calls of the step's backward graph after inductor's own decompositions (what inductor lowers on
    a GPU), traced without generating code."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return torch._functorch.aot_autograd.make_boxed_func(gm.forward)

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep,
                                     decompositions=select_decomp_table())  # fmt: skip

    torch._dynamo.reset()
    step = torch.compile(objective, fullgraph=True, backend=backend)
    out = step(batch, noise, padded=False)
    objective.loss(out, out.n_masked, out.n_tokens).loss.backward()
    forward, backward = graphs
    return [n for n in backward.graph.nodes if n.op == "call_function"]


@pytest.mark.slow
def test_embedding_gradients_stay_one_aten_kernel_under_inductor(trainer):
    """Decomposed, an embedding's gradient becomes an accumulating index_put, which deterministic
    kernels on CUDA run as one warp walking every row of an index in turn (token type 0: all B x T of
    them). Every gather of rows must reach inductor whole, as aten's segmented embedding backward."""
    batch, noise = next(micro_batches(trainer, 1))
    ops = backward_graph_ops(trainer.objective, batch, noise)
    assert [
        n.format_node() for n in ops if "index_put" in str(n.target) or "scatter_add" in str(n.target)
    ] == []
    # Three tables, each looked up by both encoders (they share the embeddings), and the generator's
    # hidden states at its masked positions.
    assert sum(n.target is torch.ops.electra.embedding_backward.default for n in ops) == 7


@pytest.mark.slow
def test_inductor_compiles_the_row_gathers_and_their_gradients_match_eager():
    """The custom op through inductor itself, as a GPU compiles it (here its C++ backend, with
    deterministic kernels as training runs): a generator's three tables, token type 0 broadcast, and its
    rows at masked positions, one of them repeated as unused slots repeat it. The same gradients as eager to
    rounding, and eager's the same as autograd's own kernels, bit for bit. (The whole step's graph is read
    above; compiling all of it here would take a minute.)"""
    from training.model import ElectraConfig, ElectraForMaskedLM

    torch.manual_seed(0)
    cfg = ElectraConfig(vocab_size=500, embedding_size=32, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64)  # fmt: skip
    generator = ElectraForMaskedLM(cfg).eval()  # no dropout: inductor draws its own random numbers
    # Its transformer layer out: the gathers are all before and after it, and compiling its forward and
    # backward took most of the test's 50 s (in a suite on two cores, with an empty inductor cache).
    generator.electra.encoder.layer = torch.nn.ModuleList()
    ids = torch.randint(5, 500, (4, 16))
    ids[:, 3] = 4  # a repeated token, as [MASK] is
    positions, targets = torch.tensor([3, 19, 35, 51, 63, 63]), torch.randint(5, 500, (6,))

    def loss(model):
        return torch.nn.functional.cross_entropy(model(ids, positions=positions), targets)

    def gradients(step, opaque: bool) -> dict[str, torch.Tensor]:
        opaque_embedding_grads(generator, opaque)
        generator.zero_grad(set_to_none=True)
        step(generator).backward()
        return {n: p.grad.clone() for n, p in generator.named_parameters() if p.grad is not None}

    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch._dynamo.reset()
        autograds = gradients(loss, opaque=False)  # nn.Embedding's and index_select's own backward
        eager = gradients(loss, opaque=True)
        compiled = gradients(torch.compile(loss, fullgraph=True), opaque=True)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert len(autograds) == len(eager) == len(compiled) == len(list(generator.parameters()))
    for name in eager:
        assert torch.equal(eager[name], autograds[name]), name  # eager: the same kernels, bit for bit
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-3, atol=1e-6, msg=name)
