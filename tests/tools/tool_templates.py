"""Tool-aware chat templates for the structured-tools tests: Qwen2.5's (Hermes calls) and Qwen3-Coder's (XML
calls), reduced to the parts that render tools, tool calls and tool messages, and a Qwen3-style one that drops
past ``<think>`` blocks from the history. Set on a character tokenizer with ``<|im_start|>`` / ``<|im_end|>``."""
from __future__ import annotations

from credo.models.tokenizer import build_char_tokenizer

_SYSTEM = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are a helpful assistant.' }}"
    "{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
)
_TOOL_MESSAGE = (
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2.5-Instruct's template (tool calls written as Hermes JSON)
QWEN25 = _SYSTEM + (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
) + _TOOL_MESSAGE

# Qwen3-Coder's template (tool calls written as <function=...><parameter=...> XML)
QWEN3_CODER = _SYSTEM + (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- for args_name, args_value in tool_call.arguments | items %}"
    "{{- '<parameter=' + args_name + '>\\n' }}"
    "{%- if args_value is mapping or (args_value is sequence and args_value is not string) %}"
    "{{- args_value | tojson }}{%- else %}{{- args_value | string }}{%- endif %}"
    "{{- '\\n</parameter>\\n' }}"
    "{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
) + _TOOL_MESSAGE

# Qwen3-style: assistant turns before the last one lose their <think>...</think> block when re-rendered
THINK_STRIPPING = QWEN25.replace(
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
    "{%- set content = message.content %}"
    "{%- if message.role == 'assistant' and '</think>' in content and not loop.last %}"
    "{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}")


def chat_tokenizer(template: str):
    """credo's character tokenizer with ``<|im_start|>`` / ``<|im_end|>`` special tokens and ``template``."""
    tok = build_char_tokenizer()
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.chat_template = template
    return tok
