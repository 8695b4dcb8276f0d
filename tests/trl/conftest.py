"""A tokenizer and a tiny model built in the test: no downloads, real transformers objects."""

from __future__ import annotations

import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = [
    "<Analyze>I will load the data and look at it.</Analyze>",
    "<Code>\n```python\nimport pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.head())\n```\n</Code>",
    "<Answer>\nThe store with the highest revenue is B.\nAnswer: B\n</Answer>",
    "\n<Execute>\n[Error]:\nTraceback (most recent call last):\n",
    "NameError: name 'x' is not defined\n</Execute>\n",
    "store,revenue\nA,10\nB,32\n0 1 2 3 4 5 6 7 8 9 groupby sum mean",
]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|pad|>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast
