#!/usr/bin/env bash
# `shardlm generate --chat` against the published chat templates rendered by jinja2 (as
# transformers' apply_chat_template renders them, add_generation_prompt=True): for each family a
# model directory whose tokenizer_config.json holds the template; generate picks the format from
# the template alone (chat_format auto) and its JSON "prompt" (the rendering) must equal jinja2's
# string. The tokenizer is GPT-2's byte-level BPE with the families' special tokens added.
# Usage: chat_templates_cli.sh SHARDLM PYTHON DATA_DIR WORKDIR
set -euo pipefail
shardlm=$1
py=$2
data=$(cd "$3" && pwd)
work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
# jinja2: Debian's python3-jinja2 (scripts/install-deps.sh --test), else a python3 on PATH that has it.
if ! "$py" -c 'import jinja2' 2>/dev/null; then
  py=python3
  "$py" -c 'import jinja2' 2>/dev/null || { echo "jinja2 not available: skipped"; exit 77; }
fi
[[ -f "$data/gpt2_vocab.json" ]] || { echo "shared test data not found at $data: skipped"; exit 77; }

"$shardlm" init --preset tiny --set vocab_size=50304 --seed 0 --out "$work/m" >/dev/null
"$py" - "$data" "$work" <<'PY'
import json, sys
data, work = sys.argv[1], sys.argv[2]
merges = [l for l in open(f"{data}/gpt2_merges.txt", encoding="utf-8").read().split("\n") if l and not l.startswith("#version")]
specials = ["<|endoftext|>", "<s>", "</s>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
added = [{"id": 50256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for i, s in enumerate(specials)]
tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": None,
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                 "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                 "vocab": json.load(open(f"{data}/gpt2_vocab.json", encoding="utf-8")), "merges": merges}}
json.dump(tok, open(f"{work}/m/tokenizer.json", "w"))
PY

# The templates as the models' tokenizer_config.json files publish them.
cat > "$work/templates.py" <<'PY'
TEMPLATES = {
  # meta-llama/Meta-Llama-3-8B-Instruct
  "llama3": ("<|begin_of_text|>", "<|eot_id|>",
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
  # meta-llama/Llama-2-7b-chat-hf
  "llama2": ("<s>", "</s>",
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"),
  # Qwen/Qwen2-7B-Instruct
  "chatml": ("<s>", "<|im_end|>",
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
  # mistralai/Mistral-7B-Instruct-v0.2
  "mistral": ("<s>", "</s>",
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n"),
}
CONVERSATIONS = [
  [{"role": "user", "content": "Hi there"}],
  [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " What is 2+2? "}],
  [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
   {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Name a river.\nOne word."}],
]
PY

for family in llama3 llama2 chatml mistral; do
  rm -rf "$work/$family" && cp -r "$work/m" "$work/$family"
  "$py" - "$work" "$family" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from templates import TEMPLATES, CONVERSATIONS
work, family = sys.argv[1], sys.argv[2]
bos, eos, template = TEMPLATES[family]
json.dump({"bos_token": bos, "eos_token": eos, "chat_template": template},
          open(f"{work}/{family}/tokenizer_config.json", "w"))
with open(f"{work}/{family}/requests.jsonl", "w") as f:
    for c in CONVERSATIONS:
        f.write(json.dumps({"messages": c, "max_new_tokens": 1, "temperature": 0}) + "\n")
PY
  "$shardlm" generate --model "$work/$family" --prompts "$work/$family/requests.jsonl" \
    > "$work/$family/out.jsonl" 2> "$work/$family/err.txt" || fail "$family: $(cat "$work/$family/err.txt")"
  grep -q "chat format $family" "$work/$family/err.txt" || fail "$family: the format was not taken from the template: $(cat "$work/$family/err.txt")"
  "$py" - "$work" "$family" <<'PY'
import json, sys
import jinja2
sys.path.insert(0, sys.argv[1])
from templates import TEMPLATES, CONVERSATIONS
work, family = sys.argv[1], sys.argv[2]
bos, eos, template = TEMPLATES[family]
def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers compiles templates
t = env.from_string(template)
rows = [json.loads(l) for l in open(f"{work}/{family}/out.jsonl")]
for c, r in zip(CONVERSATIONS, rows):
    want = t.render(messages=c, bos_token=bos, eos_token=eos, add_generation_prompt=True,
                    raise_exception=raise_exception)
    assert r["prompt"] == want, f"{family}:\n  shardlm {r['prompt']!r}\n  jinja2  {want!r}"
print(f"{family}: {len(rows)} conversations render as the published template does")
PY
done
echo "OK"
