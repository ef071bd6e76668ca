"""What a chat request constrains, as grammar text: ``response_format`` (JSON) and
``tool_choice`` required / named (Qwen3.5's XML tool-call format, with typed values).

The tool-call grammar follows the template's format exactly::

    <tool_call>\\n<function=NAME>\\n(<parameter=KEY>\\nVALUE\\n</parameter>\\n)*</function>\\n</tool_call>

``<tool_call>`` / ``</tool_call>`` are the special tokens (llguidance's ``<name>`` syntax), not
their spelling. Parameters come in the schema's order, required ones always, optional ones
maybe. A string value is raw text (no ``</`` inside, as the parser needs; enum, const,
minLength / maxLength and pattern honoured); any other value is JSON for its sub-schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tt_serve.agents.grammar import _PREFIX, GrammarError, _json_rule

NL = "\n"
_END = r"\n<\/parameter>\n"
# No "</" in a raw string value (it would end the parameter). A bounded one has no "<" at all,
# so that the regex's count is exactly the string's length.
_TEXT_CHAR = r"([^<]|<[^\/<])"
_KEY = re.compile(r"[^>\n]+")
_SLASH = re.compile(r"(\\.)|/")


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _is_string(schema: dict[str, Any]) -> bool:
    if schema.get("type") == "string":
        return True
    enum = schema.get("enum")
    return isinstance(enum, list) and bool(enum) and all(isinstance(v, str) for v in enum)


def _regex_body(pattern: str) -> str:
    body = pattern.removeprefix("^").removesuffix("$")
    # "/" ends a Lark regex: escape the bare ones, keep escapes (an already escaped "\/") whole.
    return _SLASH.sub(lambda m: m.group(1) or r"\/", body)


def _length(schema: dict[str, Any], key: str, where: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GrammarError(f"{where}.{key} must be a non-negative integer")
    return value


def _value(rule: str, schema: dict[str, Any], defs: dict[str, Any] | None, where: str) -> list[str]:
    """Lark lines defining ``rule`` as the parameter's value and its closing tag."""
    if "const" in schema and isinstance(schema["const"], str):
        return [f'{rule}: {_lit(schema["const"])} "\\n</parameter>\\n"']
    if "enum" in schema and (not isinstance(schema["enum"], list) or not schema["enum"]):
        raise GrammarError(f"{where}.enum must be a non-empty array")
    if _is_string(schema):
        if "enum" in schema:
            alts = " | ".join(_lit(v) for v in schema["enum"])
            return [f'{rule}: ({alts}) "\\n</parameter>\\n"']
        if isinstance(schema.get("pattern"), str):
            return [
                f"{rule}: {rule.upper()}_T",
                f"{rule.upper()}_T: /({_regex_body(schema['pattern'])}){_END}/",
            ]
        lo = _length(schema, "minLength", where) or 0
        hi = _length(schema, "maxLength", where)
        if hi is not None:
            chars = f"[^<]{{{lo},{hi}}}"
        else:
            chars = _TEXT_CHAR + (f"{{{lo},}}" if lo else "*")
        return [f"{rule}: {rule.upper()}_T", f"{rule.upper()}_T: /{chars}{_END}/"]
    sub = dict(schema)
    if defs:
        sub["$defs"] = defs
    return [f'{rule}: j_{rule} "\\n</parameter>\\n"', f"j_{rule}: {_json_rule(sub)}"]


def _function_rules(i: int, fn: dict[str, Any]) -> list[str]:
    where = f"tools[{i}].function.parameters"
    params = fn.get("parameters") or {}
    if not isinstance(params, dict):
        raise GrammarError(f"{where} must be an object")
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise GrammarError(f"{where}.properties must be an object")
    required_list = params.get("required") or []
    if not isinstance(required_list, list) or not all(isinstance(k, str) for k in required_list):
        raise GrammarError(f"{where}.required must be an array of strings")
    required = set(required_list)
    defs = params.get("$defs") or params.get("definitions")
    if defs is not None and not isinstance(defs, dict):
        raise GrammarError(f"{where}.$defs must be an object")
    lines: list[str] = []
    parts: list[str] = []
    for j, (key, sub) in enumerate(props.items()):
        if not isinstance(sub, dict):
            raise GrammarError(f"{where}.properties.{key} must be a schema")
        if not key or not _KEY.fullmatch(key):
            # The parser reads <parameter=KEY> up to the first ">" or newline.
            raise GrammarError(
                f"{where}.properties: {key!r} cannot be a parameter name in the tool-call "
                "format (it must be non-empty, without '>' or newlines)"
            )
        rule = f"v_{i}_{j}"
        lines += _value(rule, sub, defs, f"{where}.properties.{key}")
        item = f"({_lit(f'<parameter={key}>' + NL)} {rule})"
        parts.append(item if key in required else item + "?")
    body = " ".join(parts)
    head = _lit(NL + f"<function={fn['name']}>" + NL)
    lines.insert(0, f'call_{i}: <tool_call> {head} {body} "</function>\\n" </tool_call>')
    return lines


def tool_call_lark(
    tools: list[dict[str, Any]], only: str | None, *, parallel: bool, reasoning: bool
) -> str:
    """The grammar of ``tool_choice``: ``only`` a function name (named: exactly one call of it)
    or None (required: at least one call, more when ``parallel``)."""
    fns = [(i, t["function"]) for i, t in enumerate(tools) if only in (None, t["function"]["name"])]
    if not fns:
        raise GrammarError(f"tool_choice names {only!r}, which is not among the tools")
    lines: list[str] = []
    for i, fn in fns:
        lines += _function_rules(i, fn)
    call = " | ".join(f"call_{i}" for i, _ in fns)
    many = ' ("\\n" call)*' if parallel and only is None else ""
    pre = "PRE " if reasoning else ""
    head = [f"start: {pre}call{many}", f"call: {call}"]
    if reasoning:
        head.append(f"PRE: {_PREFIX}")
    return "\n".join(head + lines) + "\n"


def check_strict(schema: Any, path: str = "schema") -> None:
    """OpenAI's strict subset: every object lists all its properties as required and sets
    ``additionalProperties: false``. Raises GrammarError naming the first violation."""
    if isinstance(schema, list):
        for k, item in enumerate(schema):
            check_strict(item, f"{path}[{k}]")
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "object" or "properties" in schema:
        if schema.get("additionalProperties") is not False:
            raise GrammarError(f"strict mode: {path} must set additionalProperties to false")
        props = schema.get("properties") or {}
        required = schema.get("required") or []
        if not isinstance(props, dict) or not isinstance(required, list):
            raise GrammarError(f"strict mode: {path} needs properties an object, required a list")
        missing = [k for k in props if k not in required]
        if missing:
            raise GrammarError(f"strict mode: {path}.required must list every property: {missing}")
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            for name, sub in value.items():
                check_strict(sub, f"{path}.{key}.{name}")
        elif key in ("items", "anyOf", "allOf", "oneOf", "prefixItems", "additionalProperties"):
            check_strict(value, f"{path}.{key}")
