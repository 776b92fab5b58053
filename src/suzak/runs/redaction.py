"""Keeping secrets out of everything a run writes: logs, the saved recipe, run records, W&B config, model cards.

Secrets are the *values* of environment variables whose names say they are secret (``HF_TOKEN``, ``WANDB_API_KEY``
and any ``*_TOKEN``, ``*_KEY``, ``*_SECRET``, ``*_PASSWORD``), read at call time, so a token that ``.env`` loaded a
moment ago is covered, plus config fields that hold a token by name (``hub_token``). One function, :func:`redact`,
scrubs text, dicts and lists; :class:`RedactingFilter` applies it to every log record a handler emits.

>>> redact("token=hf_abcdef123 ok", values=["hf_abcdef123"])
'token=*** ok'
>>> redact({"hub_token": "anything", "lr": 1e-6, "note": ["hf_abcdef123"]}, values=["hf_abcdef123"])
{'hub_token': '***', 'lr': 1e-06, 'note': ['***']}
>>> is_secret_name("MY_SERVICE_TOKEN"), is_secret_name("max_new_tokens"), is_secret_name("pad_token")
(True, False, False)
>>> redact_argv(["--hub_token", "hf_typed", "--max_steps", "3", "--hub_token=hf_typed"], values=[])
['--hub_token', '***', '--max_steps', '3', '--hub_token=***']

Masks cannot reach a pickle: the Trainer writes its arguments whole into ``training_args.bin`` (output dir and every
checkpoint), so :func:`clear_secret_fields` empties credential fields before the Trainer sees them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "MASK",
    "RedactingFilter",
    "clear_secret_fields",
    "find_secrets",
    "install_log_redaction",
    "is_secret_name",
    "redact",
    "redact_argv",
    "secret_values",
]

MASK = "***"

# Environment-style names (upper case by convention, matched case-insensitively).
_SECRET_ENV = re.compile(r"^(HF_TOKEN|WANDB_API_KEY|.+_(TOKEN|KEY|SECRET|PASSWORD))$", re.IGNORECASE)
# Config fields that hold a credential (TrainingArguments' hub_token and friends); not pad_token / max_tokens.
_SECRET_FIELDS = {"hub_token", "push_to_hub_token", "hf_token", "token", "api_key", "wandb_api_key", "password"}
# Shorter values ("1", "true") would mask ordinary text; real tokens are far longer.
_MIN_SECRET_LENGTH = 6


def is_secret_name(name: str) -> bool:
    """Whether an environment variable (upper case) or config field name marks a secret."""
    if name.lower() in _SECRET_FIELDS:
        return True
    return name.isupper() and bool(_SECRET_ENV.match(name))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values currently in the environment, longest first (so a token inside another is masked whole)."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if is_secret_name(k) and v and len(v) >= _MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def _redact_text(text: str, values: Iterable[str]) -> str:
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact(obj: Any, values: Iterable[str] | None = None) -> Any:
    """``obj`` with every secret value replaced by ``***`` and secret-named fields masked; other values untouched.

    Strings, dicts (recursively; a key such as ``hub_token`` masks its value whatever it is), lists and tuples.
    ``values`` defaults to :func:`secret_values` of the current environment.
    """
    values = secret_values() if values is None else list(values)
    if isinstance(obj, str):
        return _redact_text(obj, values)
    if isinstance(obj, Mapping):
        return {
            k: MASK if isinstance(k, str) and is_secret_name(k) and v else redact(v, values) for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return type(obj)(redact(v, values) for v in obj)
    return obj


def redact_argv(argv: list[str], values: Iterable[str] | None = None) -> list[str]:
    """Command-line flags with secret values masked, including values of secret-named flags (``--hub_token X``)."""
    masked, hide_next = [], False
    for token in argv:
        name, eq, _ = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        if hide_next:
            masked.append(MASK)
        elif eq and is_secret_name(name.replace("-", "_")):
            masked.append(f"--{name}={MASK}")
        else:
            masked.append(redact(token, values))
        hide_next = bool(name) and not eq and is_secret_name(name.replace("-", "_"))
    return masked


def clear_secret_fields(*configs: Any) -> list[str]:
    """Set every credential field (``hub_token`` …) of these config objects to None; returns the names cleared.

    A caller that needs the value (the release's Hub token) takes it first and keeps it in memory only.

    >>> from types import SimpleNamespace
    >>> args = SimpleNamespace(hub_token="hf_typed", pad_token="<pad>", learning_rate=1e-6)
    >>> clear_secret_fields(args), args.hub_token, args.pad_token
    (['hub_token'], None, '<pad>')
    """
    cleared = []
    for config in configs:
        for name, value in vars(config).items():
            if is_secret_name(name) and isinstance(value, str) and value:
                setattr(config, name, None)
                cleared.append(name)
    return cleared


def find_secrets(text: str, values: Iterable[str] | None = None) -> bool:
    """Whether ``text`` contains any secret value (the last check before anything leaves the machine)."""
    values = secret_values() if values is None else values
    return any(value in text for value in values)


class RedactingFilter(logging.Filter):
    """A handler filter that masks secret values in the formatted message of every record it passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = _redact_text(message, secret_values())
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_log_redaction(*loggers: logging.Logger) -> None:
    """Add :class:`RedactingFilter` to every handler of ``loggers``, once each.

    By default the root logger and transformers' library logger, which has its own handler and does not propagate.
    Filters on a handler see records from every child logger; a filter on a logger would not.
    """
    for logger in loggers or (logging.getLogger(), logging.getLogger("transformers")):
        for handler in logger.handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())
