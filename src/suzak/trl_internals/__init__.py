"""Every use of TRL's internals (trl 1.16), and of vLLM's and transformers' where suzak reaches past their API.

The rule: suzak touches a private name of TRL only in this package, and tests/test_trl_contract.py holds a contract
test for each, so a TRL upgrade that moves one fails there, by name, instead of somewhere in a training run. Each
module holds one concern and names the internals it relies on and the tests that pin them:

- :mod:`.hooks`: ``TrainerHooks``, ``GRPOHooks``, ``SFTHooks``, the overrides themselves;
- :mod:`.rewards`: the reward-call convention, the reward guard, totals over the ranks;
- :mod:`.rounds`: dynamic sampling, the merge of its rounds, the shuffle by whole groups;
- :mod:`.epochs`: each epoch's order of the training rows, the same for a resumed run;
- :mod:`.sampler_guard`: the stale-sampler guard;
- :mod:`.tools`: TRL's tool loop, its parser and tool turns;
- :mod:`.prompts`: each distinct prompt of a batch tokenized once;
- :mod:`.video`: video rows through TRL's image-only paths;
- :mod:`.vllm_engine`: vLLM's encoder cache after a weight sync, and its CPU build;
- :mod:`.precision`: fp32 adapters, an earlier trainer's autocast, the fused LM head, non-finite steps;
- :mod:`.checkpoints`: atomic checkpoints and a resume's weights;
- :mod:`.completions`: the completions log, from TRL's ``_logs``.
"""
