"""The generation layer: local models and the token side of an episode, between ``core`` and its users.

``core`` runs an episode on text; everything that needs a tokenizer, torch or transformers to
produce or lay out that text lives here, so the core imports none of them:

- ``turn_end``: where a policy turn ends — the one rule every generation path applies (the
  KV-cache engine, both TRL rollout backends) and the stop settings handed to samplers that
  apply it themselves (vLLM under TRL and SkyRL, ``generate``).
- ``tag_tokens``: what a tokenizer's special and added tokens mean for the tag protocol.
- ``tokens``: how episode text becomes token ids (prompts, observations, tool turns).
- ``engine``: the KV-cache engine that generates one turn per episode in flight;
  ``kv_buffer`` its per-call cache, ``sampling`` its sampling rule.
- ``models``: local model references (``embedded:smollm2``, folders, hub ids) and loading their
  tokenizers; ``chat_templates``: a recipe's or command's chat template by name.
- ``interfaces``: the few tokenizer and model methods the project calls, as Protocols.

Layer rule (``tests/test_layers.py``): this package imports ``core`` and third-party libraries,
never ``trainers``, ``offline``, ``serve``, ``learn``, ``cli`` or ``rewards``; ``core`` never
imports it.
"""
