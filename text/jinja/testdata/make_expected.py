#!/usr/bin/env python3
"""Renders every template in templates/ on every conversation in cases.json
with transformers (the same steps apply_chat_template takes: messages
normalised, special tokens and keyword arguments passed, the assistant mask's
generation spans) and writes expected.json for //text/jinja:jinja_test.

    /path/to/venv/bin/python text/jinja/testdata/make_expected.py

strftime_now reads a fixed clock (2025-01-02) so that the fixture is stable;
the C test renders with text_template_render_at at the same instant (UTC).
Spans are byte offsets into the UTF-8 text.  A render transformers refuses
(raise_exception, a missing key) is recorded as an expected error."""
import datetime
import json
import os
import sys

import transformers
from transformers.utils import chat_template_utils as ctu

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = datetime.datetime(2025, 1, 2, 3, 4, 5)


class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


def main():
    ctu.datetime = FixedClock
    ctu._compile_jinja_template.cache_clear()
    cases = json.load(open(os.path.join(HERE, "cases.json")))
    out = {"transformers": transformers.__version__, "now": int(NOW.replace(tzinfo=datetime.timezone.utc).timestamp()),
           "renders": []}
    names = sorted(f for f in os.listdir(os.path.join(HERE, "templates")) if f.endswith(".jinja"))
    for name in names:
        with open(os.path.join(HERE, "templates", name), newline="") as f:
            template = f.read()
        for case in cases:
            for agp in (False, True):
                messages = ctu._normalize_chat_messages(case["messages"])
                kwargs = {"bos_token": "<s>", "eos_token": "</s>", **case.get("kwargs", {})}
                entry = {"template": name, "case": case["name"], "add_generation_prompt": agp}
                try:
                    texts, spans = ctu.render_jinja_template(
                        conversations=[messages], tools=case.get("tools"), chat_template=template,
                        return_assistant_tokens_mask=True, add_generation_prompt=agp, **kwargs)
                    text = texts[0]
                    entry["text"] = text
                    entry["generation"] = [[len(text[:a].encode()), len(text[:b].encode())] for a, b in spans[0]]
                except Exception as e:  # the C renderer must refuse too
                    entry["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
                out["renders"].append(entry)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    ok = sum("text" in r for r in out["renders"])
    print("%d renders (%d errors) of %d templates x %d cases" % (len(out["renders"]), len(out["renders"]) - ok,
                                                                len(names), len(cases)), file=sys.stderr)


if __name__ == "__main__":
    main()
