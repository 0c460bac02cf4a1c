"""Model primitives: chat templates and tokens, choice scoring over a token trie, sampling and decoding, the prefix
KV cache, weight handling, fingerprints, the strict config base.

The ground floor that acting (`agent_runtime.llm`) and training (`distill.opcd`) both stand on, so that acting
never imports training code. It imports none of this project's other packages.
"""
