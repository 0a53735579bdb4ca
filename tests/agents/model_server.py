"""A scripted model server for coding agents under test: the Anthropic
Messages API (what Claude Code speaks) and the OpenAI Responses API (what
Codex speaks), streaming, on host loopback.

It plays a fixed script, one step per model turn: the step to play is the
number of tool results and final answers the request already carries, so
an agent that resumes a conversation (`claude --continue`, `codex exec
resume`) with a new prompt gets the step after its last answer, and one
that starts afresh gets the first step again. Steps (a JSON list in the file given with
--script):
  {"write": {"path": ABSOLUTE_PATH, "content": TEXT}}   a file-writing tool call
  {"bash": COMMAND}                                       a shell tool call
  {"say": TEXT}                                           a final answer (ends the turn)
A request without tools (a title or summary side request) gets a short
text. Every request is appended to --log as one JSON line: method, path,
headers and body, so a test can assert what the agent sent (its key).

Usage: model_server.py --script FILE --log FILE --port-file FILE
"""

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


def tool_results(messages):
    """Steps already played in an Anthropic conversation: tool results, and
    assistant turns that called no tool (final answers)."""
    count = 0
    for message in messages:
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text"}]
        if message.get("role") == "assistant":
            count += not any(block.get("type") == "tool_use" for block in blocks)
        else:
            count += sum(1 for block in blocks if block.get("type") == "tool_result")
    return count


def function_outputs(items):
    """Steps already played in a Responses input: tool outputs and the
    assistant's answers."""
    kinds = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
    return sum(1 for item in items if isinstance(item, dict) and (
        item.get("type") in kinds or (item.get("type") == "message" and item.get("role") == "assistant")))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-model/1"

    def log_message(self, *args):
        pass

    def body(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {"unparsed": raw.decode("utf-8", "replace")}

    def record(self, body):
        entry = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
        }
        with LOCK, open(self.server.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")

    def send_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True

    def event(self, kind, data):
        self.wfile.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def do_GET(self):
        self.record(None)
        if self.path.rstrip("/").endswith("/models"):
            self.send_json(200, {"data": [], "object": "list", "models": []})
        else:
            self.send_json(404, {"error": {"message": "not scripted: " + self.path}})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        body = self.body()
        self.record(body)
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/messages/count_tokens"):
            self.send_json(200, {"input_tokens": 10})
        elif path.endswith("/messages"):
            self.anthropic(body)
        elif path.endswith("/responses"):
            self.openai_responses(body)
        else:
            self.send_json(404, {"error": {"message": "not scripted: " + self.path}})

    # --- Anthropic Messages -------------------------------------------------

    def anthropic_blocks(self, body):
        if not body.get("tools"):
            return [{"type": "text", "text": "Scripted session"}], "end_turn"
        done = tool_results(body.get("messages", []))
        steps = self.server.script
        step = steps[done] if done < len(steps) else {"say": "All steps done."}
        call = f"toolu_{done:04d}"
        if "write" in step:
            return [{"type": "tool_use", "id": call, "name": "Write",
                     "input": {"file_path": step["write"]["path"], "content": step["write"]["content"]}}], "tool_use"
        if "bash" in step:
            return [{"type": "tool_use", "id": call, "name": "Bash",
                     "input": {"command": step["bash"], "description": "scripted step"}}], "tool_use"
        return [{"type": "text", "text": step["say"]}], "end_turn"

    def anthropic(self, body):
        blocks, stop = self.anthropic_blocks(body)
        message = {"id": "msg_scripted", "type": "message", "role": "assistant",
                   "model": body.get("model", "scripted"), "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 0}}
        if not body.get("stream"):
            message.update(content=blocks, stop_reason=stop)
            self.send_json(200, message)
            return
        self.start_stream()
        self.event("message_start", {"type": "message_start", "message": message})
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                self.event("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "text", "text": ""}})
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                start = dict(block, input={})
                self.event("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": start})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            self.event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            self.event("content_block_stop", {"type": "content_block_stop", "index": index})
        self.event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": 5}})
        self.event("message_stop", {"type": "message_stop"})

    # --- OpenAI Responses ---------------------------------------------------

    def shell_call(self, body, command, call):
        """A shell call in the form of whichever shell tool the agent offered."""
        names = [t.get("name") for t in body.get("tools", []) if isinstance(t, dict)]
        if "exec_command" in names:
            name, args = "exec_command", {"cmd": command}
        elif "shell_command" in names:
            name, args = "shell_command", {"command": command}
        else:
            name, args = "shell", {"command": ["bash", "-lc", command]}
        return {"type": "function_call", "id": "fc_" + call, "call_id": call, "name": name,
                "arguments": json.dumps(args)}

    def openai_responses(self, body):
        items = body.get("input", [])
        done = function_outputs(items if isinstance(items, list) else [])
        steps = self.server.script
        step = steps[done] if done < len(steps) else {"say": "All steps done."}
        call = f"call_{done:04d}"
        if not body.get("tools"):
            item = {"type": "message", "role": "assistant", "id": "msg_side",
                    "content": [{"type": "output_text", "text": "Scripted session"}]}
        elif "write" in step:
            path, content = step["write"]["path"], step["write"]["content"]
            command = f"mkdir -p \"$(dirname '{path}')\" && cat > '{path}' <<'PVISOR_EOF'\n{content}\nPVISOR_EOF"
            item = self.shell_call(body, command, call)
        elif "bash" in step:
            item = self.shell_call(body, step["bash"], call)
        else:
            item = {"type": "message", "role": "assistant", "id": "msg_" + call,
                    "content": [{"type": "output_text", "text": step["say"]}]}
        response_id = "resp_" + call
        self.start_stream()
        self.event("response.created", {"type": "response.created", "response": {"id": response_id}})
        self.event("response.output_item.done", {"type": "response.output_item.done", "item": item})
        usage = {"input_tokens": 10, "input_tokens_details": None, "output_tokens": 5,
                 "output_tokens_details": None, "total_tokens": 15}
        self.event("response.completed", {"type": "response.completed",
                                          "response": {"id": response_id, "usage": usage}})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()
    with open(args.script, encoding="utf-8") as f:
        script = json.load(f)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.script = script
    server.log_path = args.log
    with open(args.port_file + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(server.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
