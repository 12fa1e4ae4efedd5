#!/usr/bin/env python3
"""Turns text, JSONL and chat data into Strata's token files with a model directory's tokenizer.

  tools/prepare_data.sh --model MODEL_DIR --input FILE [FILE ...] --output OUT_DIR [options]

Inputs (by extension; --format overrides):
  *.jsonl, *.json   one JSON object per line, each one of
                      {"text": "..."}                          a document; every token counts
                      {"messages": [{"role": ..., "content": ...}, ...]}
                                                               a conversation, rendered with the
                                                               model's chat template; only the
                                                               assistant's turns count in the loss
                      {"prompt": "...", "response": "..."}     ("completion" for "response"): the
                                                               prompt carries no loss
  anything else     plain text: the whole file is one document (--text-docs line | paragraph: one
                    per non-empty line, or per blank-line-separated paragraph)

Outputs in OUT_DIR (docs/data.md describes the formats):
  train.bin, train.mask.bin      llm.c token file (uint16 ids, uint32 when the model's vocabulary
                                 exceeds 65536) and its mask file: per token, whether it counts in
                                 the loss and whether a document starts there
  val.bin, val.mask.bin          with --val-fraction: every k-th document (k = 1 / fraction)
  prepare.json                   what was prepared, from what, with which tokenizer
Each document ends with the tokenizer's end-of-document token (eos_token). Files are written under
temporary names and renamed only when complete; on any error nothing is left that looks complete,
and the message names the input file and line.

Needs `tokenizers`, `numpy`, `xxhash` (and `transformers` for chat templates), installed by
tools/setup.sh into ~/.cache/strata/data-venv; no PyTorch. Strata itself never needs Python.
"""
import argparse
import json
import multiprocessing
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no notice that PyTorch is absent

import numpy as np  # noqa: E402
import xxhash  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

LLMC_MAGIC = 20240520
MASK_MAGIC = 0x4B53414D  # "MASK" in file order
HEADER_INTS = 256
COUNTS_IN_LOSS = 1
STARTS_DOCUMENT = 2
TOKENS_MAX = 2**31 - 1  # the llm.c header counts tokens in an int32


class DataError(Exception):
    """A bad input: the message names the file (and line) at fault."""


def fail(where, message):
    raise DataError(f"{where}: {message}")


# ---- the model directory ------------------------------------------------------------------------

def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        fail(path, f"cannot read it as JSON: {e}")


def token_content(value):
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class Model:
    """What preparation needs from a Hugging Face model directory."""

    def __init__(self, directory, eos_override):
        self.directory = directory
        if not os.path.isdir(directory):
            fail(directory, "not a directory (expected a Hugging Face model directory)")
        tokenizer_path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(tokenizer_path):
            fail(tokenizer_path, "not found: the model directory has no tokenizer.json, and data "
                 "must be tokenized with the model's own tokenizer (copy tokenizer.json and "
                 "tokenizer_config.json from the Hugging Face model this directory came from)")
        try:
            self.tokenizer = Tokenizer.from_file(tokenizer_path)
        except Exception as e:  # the tokenizers library raises plain Exceptions
            fail(tokenizer_path, f"not a tokenizer the `tokenizers` library can load: {e}")
        self.tokenizer_path = tokenizer_path
        config_path = os.path.join(directory, "config.json")
        config = read_json(config_path)
        if config is None:
            fail(config_path, "not found: the model's vocabulary size comes from config.json")
        config = config.get("text_config", config) if "vocab_size" not in config else config
        self.vocab_size = config.get("vocab_size")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            fail(config_path, f"vocab_size is {self.vocab_size!r}; a positive integer is expected")
        self.tokenizer_config = read_json(os.path.join(directory, "tokenizer_config.json")) or {}
        self.eos_id, self.eos_token = self._eos(config, eos_override)
        template_file = os.path.join(directory, "chat_template.jinja")
        self.has_chat_template = bool(self.tokenizer_config.get("chat_template")) or \
            os.path.isfile(template_file)
        self.chat = None  # a transformers tokenizer, loaded when a conversation needs it
        self.adds_eos = self._post_processor_adds_eos()

    def _eos(self, config, override):
        where = os.path.join(self.directory, "tokenizer_config.json")
        token = override or token_content(self.tokenizer_config.get("eos_token"))
        if token is not None:
            eos = self.tokenizer.token_to_id(token)
            if eos is None:
                fail(where if not override else "--eos-token",
                     f"the end-of-document token {token!r} is not in tokenizer.json's vocabulary")
            return eos, token
        eos = config.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if not isinstance(eos, int):
            fail(where, "names no eos_token, and config.json no eos_token_id: pass --eos-token "
                 "with the token that ends a document")
        return eos, self.tokenizer.id_to_token(eos)

    def _post_processor_adds_eos(self):
        ids = self.tokenizer.encode("", add_special_tokens=True).ids
        return bool(ids) and ids[-1] == self.eos_id

    def load_chat_template(self):
        """transformers' own apply_chat_template, so conversations render as at inference."""
        if self.chat is None:
            import transformers  # only when a chat template is needed
            try:
                self.chat = transformers.AutoTokenizer.from_pretrained(self.directory)
            except Exception as e:  # transformers raises many kinds
                fail(self.directory, f"transformers cannot load its tokenizer, whose chat "
                     f"template renders conversations: {e}")
        return self.chat


# ---- turning records into tokens (runs in the worker processes) ---------------------------------

MODEL = None      # set before the workers fork
SETTINGS = None


def encode(text, special):
    return MODEL.tokenizer.encode(text, add_special_tokens=special)


# Each document_of_* returns (ids, flags, whether the end-of-document token appended after it
# counts in the loss). A conversation's last turn ends with the template's own end-of-turn token,
# which counts; the separator after it does not. Text and plain responses learn to stop at it.

def document_of_text(text):
    ids = encode(text, True).ids
    return ids, [COUNTS_IN_LOSS] * len(ids), True


def document_of_pair(where, prompt, response):
    if not isinstance(prompt, str) or not isinstance(response, str):
        fail(where, "\"prompt\" and \"response\" must be strings")
    if SETTINGS.pairs == "chat":
        return document_of_chat(where, [{"role": "user", "content": prompt},
                                        {"role": "assistant", "content": response}])
    p = encode(prompt, True).ids
    if MODEL.adds_eos and p and p[-1] == MODEL.eos_id:
        p = p[:-1]
    r = encode(response, False).ids
    return p + r, [0] * len(p) + [COUNTS_IN_LOSS] * len(r), True


def render(where, messages, generation_prompt):
    try:
        text = MODEL.chat.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=generation_prompt)
    except Exception as e:  # jinja2 errors, raise_exception() in templates
        fail(where, f"the model's chat template cannot render this conversation: {e}")
    if not isinstance(text, str):
        fail(where, "the chat template did not render to text")
    return text


def document_of_chat(where, messages):
    if not MODEL.has_chat_template:
        fail(where, f"a conversation (\"messages\"), but {MODEL.directory} has no chat template "
             "(tokenizer_config.json \"chat_template\" or chat_template.jinja)")
    if not isinstance(messages, list) or not messages:
        fail(where, "\"messages\" must be a non-empty list of {\"role\": ..., \"content\": ...}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            fail(where, f"message {i} is not an object with a \"role\" string and \"content\"")
    MODEL.load_chat_template()
    full = render(where, messages, False)
    # The assistant's turns: what rendering one more message adds after the generation prompt
    # (the reply and its end-of-turn marker; the role header belongs to the prompt).
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or SETTINGS.no_mask:
            continue
        before = render(where, messages[:i], True) if i > 0 else ""
        upto = render(where, messages[:i + 1], False)
        if not upto.startswith(before) or not full.startswith(upto):
            fail(where, f"the chat template does not render this conversation turn by turn (the "
                 f"text up to assistant message {i} is not a prefix of the whole), so its "
                 "assistant tokens cannot be told apart; use --no-mask or prompt/response pairs")
        spans.append((len(before), len(upto)))
    encoding = encode(full, False)
    if SETTINGS.no_mask:
        flags = [COUNTS_IN_LOSS] * len(encoding.ids)
    else:
        flags = [COUNTS_IN_LOSS if any(a <= start < b for a, b in spans) else 0
                 for start, _ in encoding.offsets]
    return list(encoding.ids), flags, SETTINGS.no_mask


def document_of_record(where, line):
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        fail(where, f"not valid JSON: {e.msg} at column {e.colno}")
    if not isinstance(record, dict):
        fail(where, f"a JSON object is expected, found {type(record).__name__}")
    key = SETTINGS.text_key
    if key in record:
        if not isinstance(record[key], str):
            fail(where, f"\"{key}\" must be a string, found {type(record[key]).__name__}")
        return "text", document_of_text(record[key])
    if "messages" in record:
        return "chat", document_of_chat(where, record["messages"])
    response = "response" if "response" in record else "completion"
    if "prompt" in record and response in record:
        return "pair", document_of_pair(where, record["prompt"], record[response])
    keys = ", ".join(f"\"{k}\"" for k in list(record)[:8]) or "none"
    fail(where, f"the record has none of the fields \"{key}\", \"messages\", or \"prompt\" with "
         f"\"response\"/\"completion\" (its keys: {keys})")


def finish_document(where, ids, flags, eos_counts):
    """Appends the end-of-document token and checks the ids; None for a document to skip."""
    if not ids:
        return None
    if ids[-1] != MODEL.eos_id:
        ids = ids + [MODEL.eos_id]
        flags = flags + [COUNTS_IN_LOSS if eos_counts else 0]
    array = np.asarray(ids, dtype=np.int64)
    bad = np.flatnonzero((array < 0) | (array >= MODEL.vocab_size))
    if bad.size:
        token = int(array[bad[0]])
        fail(where, f"token id {token} ({MODEL.tokenizer.id_to_token(token)!r}) is outside the "
             f"model's vocabulary [0, {MODEL.vocab_size}) (config.json vocab_size): the "
             "tokenizer and the model do not match")
    flag_array = np.asarray(flags, dtype=np.uint8)
    flag_array[0] |= STARTS_DOCUMENT
    return array.astype(np.uint32), flag_array


def work(chunk):
    """One chunk of input: (path, [(line number, text)], kind, bytes)."""
    path, lines, kind, size = chunk
    out = []
    stats = {"text": 0, "chat": 0, "pair": 0, "skipped": 0, "too_long": 0}
    for line_number, line in lines:
        where = f"{path}:{line_number}"
        if not line.strip():
            continue  # a blank line is no record, and a blank document nothing to learn
        try:
            if kind == "jsonl":
                doc_kind, (ids, flags, eos_counts) = document_of_record(where, line)
            else:
                doc_kind, (ids, flags, eos_counts) = "text", document_of_text(line)
        except DataError:
            raise
        except Exception as e:  # from the tokenizer or the template engine: still say where
            fail(where, f"{type(e).__name__}: {e}")
        document = finish_document(where, ids, flags, eos_counts)
        if document is None:
            stats["skipped"] += 1
        elif SETTINGS.max_tokens and len(document[0]) > SETTINGS.max_tokens:
            stats["too_long"] += 1
        else:
            stats[doc_kind] += 1
            out.append(document)
    return out, stats, size


def work_safely(chunk):
    try:
        return work(chunk)
    except DataError as e:
        return str(e)


# ---- reading inputs -----------------------------------------------------------------------------

def input_kind(path, forced):
    if forced != "auto":
        return forced
    return "jsonl" if path.endswith((".jsonl", ".json")) else "text"


def may_hold_conversations(path, forced):
    """Whether a JSONL file may need the chat template (a worker loads it anyway if so)."""
    if input_kind(path, forced) != "jsonl":
        return False
    import mmap
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b'"messages"') >= 0 or m.find(b'"prompt"') >= 0


def documents_in(text, kind, text_docs):
    """(first line number, text) of each record or document of one input file."""
    if kind == "text" and text_docs == "file":
        yield 1, text
        return
    lines = text.split("\n")
    if kind == "jsonl" or text_docs == "line":
        yield from ((i + 1, line) for i, line in enumerate(lines))
        return
    first, current = 1, []
    for i, line in enumerate(lines + [""]):
        if line.strip():
            if not current:
                first = i + 1
            current.append(line)
        elif current:
            yield first, "\n".join(current)
            current = []


def chunks(paths, forced, text_docs, chunk_bytes):
    """Pieces of input of about chunk_bytes for the workers, in input order."""
    for path in paths:
        kind = input_kind(path, forced)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            fail(path, f"cannot read it: {e.strerror}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[:e.start].count(b"\n") + 1
            fail(f"{path}:{line}", f"not UTF-8 text (byte {e.start} is {data[e.start]:#04x})")
        piece, size = [], 0
        for line_number, document in documents_in(text, kind, text_docs):
            piece.append((line_number, document))
            size += len(document) + 1
            if size >= chunk_bytes:
                yield path, piece, kind, size
                piece, size = [], 0
        if piece:
            yield path, piece, kind, size


# ---- writing ------------------------------------------------------------------------------------

class Output:
    """One token file and its mask file, written under temporary names."""

    def __init__(self, directory, stem, width):
        self.final = [os.path.join(directory, f"{stem}.bin"),
                      os.path.join(directory, f"{stem}.mask.bin")]
        self.temp = [os.path.join(directory, f".{stem}.bin.partial"),
                     os.path.join(directory, f".{stem}.mask.bin.partial")]
        self.width = width
        self.tokens = open(self.temp[0], "wb")
        self.mask = open(self.temp[1], "wb")
        self.tokens.write(b"\0" * (HEADER_INTS * 4))
        self.mask.write(b"\0" * (HEADER_INTS * 4))
        self.hash = xxhash.xxh3_64()
        self.count = 0
        self.counted = 0
        self.documents = 0

    def add(self, ids, flags):
        if self.count + len(ids) > TOKENS_MAX:
            fail(self.final[0], f"more than {TOKENS_MAX} tokens: the llm.c header counts them in "
                 "an int32; prepare the input in parts")
        data = ids.astype("<u2" if self.width == 2 else "<u4").tobytes()
        self.tokens.write(data)
        self.hash.update(data)
        self.mask.write(flags.tobytes())
        self.count += len(ids)
        self.counted += int(np.count_nonzero(flags & COUNTS_IN_LOSS))
        self.documents += 1

    def commit(self):
        header = np.zeros(HEADER_INTS, dtype="<i4")
        header[:3] = (LLMC_MAGIC, 1 if self.width == 2 else 2, self.count)
        self.tokens.seek(0)
        self.tokens.write(header.tobytes())
        mask_header = np.zeros(HEADER_INTS, dtype="<u4")
        mask_header[0], mask_header[1] = MASK_MAGIC, 1
        mask_header[2], mask_header[3] = self.count & 0xFFFFFFFF, self.count >> 32
        digest = self.hash.intdigest()
        mask_header[4], mask_header[5] = digest & 0xFFFFFFFF, digest >> 32
        self.mask.seek(0)
        self.mask.write(mask_header.tobytes())
        for f in (self.tokens, self.mask):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        # The mask records the tokens' checksum, so a reader refuses a pair caught between the
        # two renames.
        for temp, final in zip(self.temp, self.final):
            os.replace(temp, final)

    def discard(self):
        for f in (self.tokens, self.mask):
            f.close()
        for temp in self.temp:
            if os.path.exists(temp):
                os.remove(temp)


class Progress:
    def __init__(self, total, quiet):
        self.bar = None
        if not quiet:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr,
                                desc="prepare", mininterval=0.5)
            except ImportError:
                pass

    def update(self, n):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def is_validation(index, fraction):
    """Every k-th document (k = 1 / fraction), whatever the number of workers."""
    return fraction > 0 and int((index + 1) * fraction) > int(index * fraction)


def prepare(args):
    global MODEL, SETTINGS
    MODEL = Model(args.model, args.eos_token)
    SETTINGS = args
    if args.pairs == "auto":
        args.pairs = "chat" if MODEL.has_chat_template else "plain"
    for path in args.input:
        if not os.path.isfile(path):
            fail(path, "not found (or not a file)")
    if MODEL.has_chat_template and any(may_hold_conversations(p, args.format)
                                       for p in args.input):
        MODEL.load_chat_template()  # before the workers fork, so they share it
    os.makedirs(args.output, exist_ok=True)
    width = 2 if MODEL.vocab_size <= 65536 else 4
    total = sum(os.path.getsize(p) for p in args.input)
    outputs = {"train": Output(args.output, "train", width)}
    if args.val_fraction > 0:
        outputs["val"] = Output(args.output, "val", width)
    stats = {"text": 0, "chat": 0, "pair": 0, "skipped": 0, "too_long": 0}
    progress = Progress(total, args.quiet)
    pool = None
    try:
        pieces = chunks(args.input, args.format, args.text_docs, args.chunk_bytes)
        if args.workers > 1:
            pool = multiprocessing.get_context("fork").Pool(args.workers)
            results = pool.imap(work_safely, pieces, chunksize=1)  # in input order
        else:
            results = map(work_safely, pieces)
        index = 0
        for result in results:
            if isinstance(result, str):
                raise DataError(result)
            documents, chunk_stats, size = result
            for key, value in chunk_stats.items():
                stats[key] += value
            for ids, flags in documents:
                split = "val" if is_validation(index, args.val_fraction) else "train"
                outputs[split].add(ids, flags)
                index += 1
            progress.update(size)
        progress.close()
        if outputs["train"].count == 0:
            fail(args.input[0], "no document to prepare (every input was empty or skipped)")
        if "val" in outputs and outputs["val"].count == 0:
            print(f"prepare_data: warning: no document went to validation ({index} documents x "
                  f"{args.val_fraction} < 1); Strata holds out its own strata.data.val_fraction "
                  "of train.bin instead", file=sys.stderr)
            outputs.pop("val").discard()
        for output in outputs.values():
            output.commit()
    except BaseException:
        progress.close()
        for output in outputs.values():
            output.discard()
        raise
    finally:
        if pool is not None:
            pool.terminate()
    if "val" not in outputs:  # a previous run's split does not belong to these tokens
        for name in ("val.bin", "val.mask.bin"):
            stale = os.path.join(args.output, name)
            if os.path.exists(stale):
                os.remove(stale)
    summary = {
        "model": os.path.abspath(args.model),
        "tokenizer": os.path.abspath(MODEL.tokenizer_path),
        "inputs": [os.path.abspath(p) for p in args.input],
        "vocab_size": MODEL.vocab_size,
        "token_bytes": width,
        "eos_token": MODEL.eos_token,
        "eos_id": MODEL.eos_id,
        "documents": {k: v for k, v in stats.items()},
        "loss_mask": not args.no_mask,
    }
    for name, output in outputs.items():
        summary[name] = {"path": output.final[0], "mask": output.final[1],
                         "tokens": output.count, "loss_tokens": output.counted,
                         "documents": output.documents}
    manifest = os.path.join(args.output, "prepare.json")
    with open(manifest + ".partial", "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    os.replace(manifest + ".partial", manifest)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face model directory "
                        "(tokenizer.json, tokenizer_config.json, config.json)")
    parser.add_argument("--input", required=True, nargs="+", help="text or JSONL files")
    parser.add_argument("--output", required=True, help="directory for train.bin and the rest")
    parser.add_argument("--format", choices=["auto", "jsonl", "text"], default="auto",
                        help="input format (auto: *.jsonl / *.json are JSONL, others text)")
    parser.add_argument("--text-docs", choices=["file", "line", "paragraph"], default="file",
                        help="plain text: one document per file, line or paragraph")
    parser.add_argument("--text-key", default="text", help="JSONL field holding a document")
    parser.add_argument("--pairs", choices=["auto", "chat", "plain"], default="auto",
                        help="prompt/response records: rendered with the chat template as a "
                        "user and an assistant turn, or plain prompt + response (auto: chat "
                        "when the model has a template)")
    parser.add_argument("--no-mask", action="store_true",
                        help="every token counts in the loss, prompts too")
    parser.add_argument("--val-fraction", type=float, default=0.0,
                        help="share of the documents written to val.bin (0 = none)")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="drop documents longer than this many tokens (0 = keep all)")
    parser.add_argument("--eos-token", help="end-of-document token (default: the tokenizer's "
                        "eos_token)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: every core)")
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20,
                        help="input handed to a worker at a time (default 1 MiB)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    args = parser.parse_args(argv)
    if not 0.0 <= args.val_fraction <= 0.5:
        parser.error(f"--val-fraction {args.val_fraction}: valid 0 to 0.5")
    if args.workers < 1 or args.max_tokens < 0 or args.chunk_bytes < 1:
        parser.error("--workers and --chunk-bytes must be at least 1, --max-tokens at least 0")
    start = time.time()
    try:
        summary = prepare(args)
    except DataError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("prepare_data: interrupted; nothing was written", file=sys.stderr)
        return 130
    if not args.quiet:
        docs = summary["documents"]
        print(f"prepare_data: {docs['text']} text, {docs['chat']} chat and {docs['pair']} "
              f"prompt/response documents in {time.time() - start:.1f} s", file=sys.stderr)
        if docs["too_long"]:
            print(f"prepare_data: dropped {docs['too_long']} document(s) longer than "
                  f"{args.max_tokens} tokens", file=sys.stderr)
        for name in ("train", "val"):
            if name in summary:
                o = summary[name]
                share = 100.0 * o["loss_tokens"] / max(o["tokens"], 1)
                print(f"prepare_data: {o['path']}: {o['documents']} documents, {o['tokens']} "
                      f"tokens (uint{8 * summary['token_bytes']}), {share:.1f}% count in the "
                      f"loss", file=sys.stderr)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
