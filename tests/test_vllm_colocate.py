"""suzak's side of TRL's vLLM generation against a stand-in, where the real engine cannot answer here.

TRL builds ``trl.generation.vllm_generation.VLLMGeneration`` (which starts ``vllm.LLM``) inside
``GRPOTrainer.__init__``. Here a fake stands in for it and does what vLLM 0.24 does with a request (checked against
the real vLLM in tests/test_vllm_boundary.py): it expands each image placeholder of the prompt ids itself, with the
processor config saved in the model folder, and samples under the logit bias. Training then runs real GRPO steps
through TRL's vLLM code path (weight sync, sampled logprobs, importance-sampling correction).

What the real engine answers on the CPU (the prompt ids vLLM runs, the placeholder ban, colocated learning, the
stale-sampler guard on a frozen and a live sampler) is in the vLLM tier, tests/test_vllm_tier.py. Kept here: server
mode (TRL syncs a server's weights over NCCL only), the pre-check before step 1, the guard's wiring and arithmetic.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor
from trl import GRPOConfig

from suzak import SuzakError
from suzak.media.vision import PixelBudget
from suzak.models.loading import load_model_and_processor
from suzak.training.trainer import VLMGRPOTrainer
from suzak.trl_internals.sampler_guard import SamplerGuard, StaleSampler
from test_trainer import image_dataset, length_reward

BUDGET = PixelBudget(3136, 50176, factor=28)  # the tiny Qwen2.5-VL's 28-pixel visual tokens


class FakeVLLMGeneration:
    """Stands in for TRL's ``VLLMGeneration``: vLLM's placeholder expansion and logit bias, random completions."""

    instances: list = []

    def __init__(self, model, accelerator, processing_class, **kwargs):
        self.mode = kwargs["mode"]
        self.generation_kwargs = kwargs.get("generation_kwargs") or {}
        self.max_completion_length = kwargs["max_completion_length"]
        self.vllm_processor = AutoProcessor.from_pretrained(model.name_or_path)  # what vLLM loads: the saved config
        self.image_token_id = processing_class.image_token_id
        self.vocab_size = len(processing_class.tokenizer)
        self.syncs = 0
        self.events: list[str] = []  # "sync", then "encoder cache reset" (colocate) or a POST (server)
        self.requests: list[tuple[list[int], list]] = []  # (prompt ids as received, images)
        self.expanded: list[list[int]] = []  # the prompt ids vLLM would run
        events = self.events
        engine = type("Engine", (), {"reset_encoder_cache": lambda self: events.append("encoder cache reset")})()
        self.llm = type("LLM", (), {"llm_engine": engine})()
        response = type("Response", (), {"status_code": 200})()
        session = type("Session", (), {"post": lambda self, url: events.append(f"POST {url}") or response})()
        self.vllm_client = type("Client", (), {"base_url": "http://127.0.0.1:8000", "session": session,
                                               "get_server_info": lambda self: {"model_config": {
                                                   "logprobs_mode": "processed_logprobs"}}})()  # fmt: skip
        FakeVLLMGeneration.instances.append(self)

    def sync_weights(self):
        self.syncs += 1
        self.events.append("sync")

    def expand(self, ids: list[int], images: list) -> list[int]:
        """vLLM's expansion: every ``<|image_pad|>`` becomes the visual tokens of the next image (its own processor)."""
        grids = self.vllm_processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
        counts = iter((grids.prod(dim=1) // 4).tolist())
        out = []
        for token in ids:
            out += [token] * next(counts) if token == self.image_token_id else [token]
        return out

    def generate(self, prompts, images, num_generations, profiler=None):
        generator = torch.Generator().manual_seed(len(self.requests))
        banned = {int(t) for t, bias in (self.generation_kwargs.get("logit_bias") or {}).items() if bias <= -100}
        allowed = torch.tensor([t for t in range(self.vocab_size) if t not in banned])
        completions, logprobs = [], []
        for ids, imgs in zip(prompts, images or [None] * len(prompts), strict=True):
            self.requests.append((list(ids), imgs))
            colocate = self.mode == "colocate"  # the server instead places its image features on the runs of pads
            self.expanded.append(self.expand(list(ids), imgs) if imgs and colocate else list(ids))
            length = int(torch.randint(1, self.max_completion_length + 1, (1,), generator=generator))
            completions.append(allowed[torch.randint(len(allowed), (length,), generator=generator)].tolist())
            logprobs.append([[-2.0]] * length)
        return prompts, completions, logprobs, None


@pytest.fixture
def fake_vllm(monkeypatch):
    import trl.trainer.grpo_trainer as grpo_trainer

    FakeVLLMGeneration.instances.clear()
    monkeypatch.setattr(grpo_trainer, "VLLMGeneration", FakeVLLMGeneration)
    return FakeVLLMGeneration.instances


def _trainer(tiny_model_dir, tmp_path, budget=BUDGET, guard: SamplerGuard | None = None, **config):
    """The trainer on the stand-in; its log-probabilities are made up, so the stale-sampler guard is off unless a
    test turns it on."""
    from trl import ModelConfig

    model, processor = load_model_and_processor(ModelConfig(model_name_or_path=str(tiny_model_dir)),
                                                GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False))  # fmt: skip
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_steps=2,
                      max_completion_length=6, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none",
                      logging_steps=1, save_strategy="no", use_vllm=True, **config)  # fmt: skip
    return VLMGRPOTrainer(model=model, reward_funcs=[length_reward], args=args, train_dataset=image_dataset(8),
                          processing_class=processor, pixel_budget=budget, preflight_rows=0,
                          sampler_guard=guard or SamplerGuard(every=0))  # fmt: skip


def test_server_mode_keeps_expanded_prompts(fake_vllm, tiny_model_dir, tmp_path):
    """The server path places precomputed image features on the runs of image tokens: it needs them expanded."""
    trainer = _trainer(tiny_model_dir, tmp_path, vllm_mode="server")
    trainer.args.max_steps = 1
    trainer.train()
    (vllm,) = fake_vllm
    pad = trainer.processing_class.image_token_id
    for ids, (image,) in vllm.requests:
        assert ids.count(pad) == BUDGET.tokens(image.height, image.width)
    assert vllm.events == ["sync", "POST http://127.0.0.1:8000/reset_encoder_cache"]  # the server's dev endpoint


def test_budget_outside_the_model_folders_processor_bounds_stops_before_step_1(fake_vllm, tiny_model_dir, tmp_path):
    """The tiny model's saved processor resizes into 3136..401408 pixels: vLLM would shrink bigger budgets."""
    trainer = _trainer(tiny_model_dir, tmp_path, budget=PixelBudget(3136, 1003520), vllm_mode="colocate")
    with pytest.raises(SuzakError, match=r"vLLM resizes images into 3136\.\.401408 pixels .* max_pixels <= 401408"):
        trainer.train()
    assert trainer.state.global_step == 0 and fake_vllm[0].requests == []


def test_a_sampler_that_is_not_the_policy_stops_at_the_first_check(fake_vllm, tiny_model_dir, tmp_path):
    """The stand-in's log-probabilities (-2 for every token) are not the policy's (~log 1/600 for the random tiny
    model): the guard's first check, right after the first weight sync, stops the run in one line before any
    update. With the real engine, tests/test_vllm_tier.py shows it firing on a frozen LM head and quiet on a live one."""
    trainer = _trainer(tiny_model_dir, tmp_path, guard=SamplerGuard(every=10, tolerance=0.1), vllm_mode="colocate")
    with pytest.raises(StaleSampler) as stopped:
        trainer.train()
    message = str(stopped.value)
    assert "\n" not in message and message.startswith("vLLM's sampler does not follow the policy: mean |log p(vLLM)")
    assert "at step 1 " in message and "before any update the two already disagree" in message
    assert message.endswith("No step had completed, so there is no checkpoint")
    assert trainer.state.global_step == 0 and fake_vllm[0].events == ["sync", "encoder cache reset"]
    ((step, gap, largest, suppressed),) = trainer.sampler_guard.gaps
    assert step == 1 and 3 < gap <= largest  # |log(1/~600) + 2| ~ 4.4 nats per token
    assert 0 < suppressed < 0.05  # the random policy's mass on the 4 vision placeholders: ~4/600


def test_guard_checks_the_first_batch_then_every_n_steps_and_names_the_cause():
    guard = SamplerGuard(every=10, tolerance=0.1)
    checked = [step for step in range(1, 32) if guard.due(step) and guard.check(step, 0.01, 0.05, 0.2) is None]
    assert checked == [1, 11, 21, 31]
    with pytest.raises(StaleSampler, match=r"= 0\.300 per completion token at step 41 \(max 1\.50; tolerance 0\.1.*"
                                           r"weights the sync did not reach"):  # fmt: skip
        guard.check(41, 0.3, 1.5)
    first = SamplerGuard(every=10, tolerance=0.1)
    with pytest.raises(StaleSampler, match="before any update the two already disagree: vLLM sees other prompt"):
        first.check(1, 0.5, 2.0)
    assert not SamplerGuard(every=0).due(1)
    SamplerGuard().check(1, float("nan"), float("nan"))  # no token scored: nothing to compare


@pytest.mark.parametrize(
    ("cuts", "kept"),
    [
        ({}, [0, 1, 2, 3]),
        ({"top_k": 2}, [0, 1]),
        ({"top_p": 0.7}, [0, 1]),  # 0.64 for the first token alone is under 0.7: the second joins
        ({"top_p": 0.5}, [0]),
        ({"min_p": 0.3}, [0, 1]),  # probabilities 0.64, 0.24, 0.09, 0.03: under 0.3 x 0.64 goes
        ({"logit_bias": {0: -100.0}}, [1, 2, 3]),
    ],
)
def test_sampling_logps_cuts_and_renormalises_as_vllm_does(cuts, kept):
    from suzak.trl_internals.sampler_guard import sampling_logps

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = sampling_logps(logits, temperature=1.0, **cuts).exp()[0]
    assert (probs > 1e-30).nonzero().flatten().tolist() == kept
    expected = torch.tensor([2.0, 1.0, 0.0, -1.0])[kept].softmax(-1)
    assert torch.allclose(probs[kept], expected) and torch.isclose(probs.sum(), torch.tensor(1.0))
    hotter = sampling_logps(logits, temperature=2.0).exp()[0]
    assert torch.allclose(hotter, (logits[0] / 2).softmax(-1))
