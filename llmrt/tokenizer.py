"""llmrt/tokenizer.py — text <-> token ids from GGUF metadata, behaving like llama.cpp's llama-vocab.

    tok = Tokenizer.from_gguf(gguf_file.metadata)   # None for "no_vocab"/"none"/absent models
    ids = tok.encode("Hello", add_special=True)      # BOS/EOS per tokenizer.ggml.add_{bos,eos}_token
    text = tok.decode(ids)                            # llama_detokenize semantics (see decode)
    det = IncrementalDetokenizer(tok)                 # streaming: put(id) -> str, flush() -> str

Two vocabulary kinds, selected by `tokenizer.ggml.model`:

* "llama" (SentencePiece, SPM): a real sentencepiece ModelProto (BPE model type: the GGUF scores
  are merge priorities, as in llama.cpp's llm_tokenizer_spm) is serialized by hand from the
  tokens/scores/token types and loaded with sentencepiece.SentencePieceProcessor(model_proto=...).
  Spaces are escaped to U+2581 and a dummy space is prepended (add_dummy_prefix) when
  tokenizer.ggml.add_space_prefix (default true); characters without a piece fall back to the
  <0xXX> byte pieces.
* "gpt2" (byte-level BPE): a `tokenizers` BPE model over tokenizer.ggml.tokens/merges behind a
  pre-tokenizer made of the regex splits llama.cpp uses for tokenizer.ggml.pre (PRE_TOKENIZERS
  below) followed by the GPT-2 byte-to-unicode mapping.

Everything around the core BPE is done here, the way llama.cpp does it, so both kinds share it:
special-token partitioning (user-defined tokens always; control/unknown tokens only with
parse_special), BOS/EOS insertion, token attributes (including llama.cpp's promotion of
EOG-looking texts to control), the end-of-generation set, and detokenization (piece table,
leading-space removal, clean_up_tokenization_spaces), which is pure Python on bytes.

Token piece types written into the sentencepiece proto are chosen so that sentencepiece's BPE
gives exactly llama.cpp's merges: llama.cpp merges into *any* vocabulary entry (its
text_to_token ignores the type), and user-defined texts are already cut out of the text before
the BPE sees it. So: byte tokens -> BYTE, the unknown id -> UNKNOWN, control tokens -> CONTROL
unless their text can be built by merges (then NORMAL, as llama.cpp would emit them), and
everything else (normal, user-defined, unused) -> NORMAL.
"""
from __future__ import annotations

import codecs
import logging
import struct
from functools import lru_cache

import numpy as np

from llmrt.checks import is_int
from llmrt.errors import ModelFormatError

log = logging.getLogger("llmrt")

# GGUF token types (llama.h enum llama_token_type)
TT_UNDEFINED, TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = range(7)

# token attributes (llama.h enum llama_token_attr): bit flags
A_UNDEFINED = 0
A_UNKNOWN = 1 << 0
A_UNUSED = 1 << 1
A_NORMAL = 1 << 2
A_CONTROL = 1 << 3
A_USER_DEFINED = 1 << 4
A_BYTE = 1 << 5
A_LSTRIP = 1 << 7
A_RSTRIP = 1 << 8

_TYPE_TO_ATTR = {TT_UNDEFINED: A_UNDEFINED, TT_NORMAL: A_NORMAL, TT_UNKNOWN: A_UNKNOWN,
                 TT_CONTROL: A_CONTROL, TT_USER_DEFINED: A_USER_DEFINED, TT_UNUSED: A_UNUSED,
                 TT_BYTE: A_BYTE}
_A_SPECIAL = A_UNKNOWN | A_CONTROL            # hidden unless unparse_special; parsed only if parse_special

SPM_SPACE = "\u2581"                          # SentencePiece's escaped space "▁"
_C_ISSPACE = " \t\n\v\f\r"                    # C isspace() in the "C" locale (used by lstrip/rstrip)

# Texts llama.cpp recognises as end-of-turn / end-of-message / end-of-generation (llama-vocab.cpp,
# llama_vocab::impl::load). A token with one of these texts is forced to be a control token.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
             "<end_of_utterance>")
EOM_TEXTS = ("<|eom_id|>",)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
# fill-in-the-middle tokens found by text; pad/repo/file-separator ones also end generation
FIM_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}

# ---- BPE pre-tokenizers: tokenizer.ggml.pre -> regex splits (llama-vocab.cpp, llm_tokenizer_bpe) --
# Each regex splits every piece produced by the previous one; matches and the text between matches
# both become pieces ("isolated"). Written for Oniguruma (the `tokenizers` regex engine). Where
# llama.cpp rewrote a pattern for std::regex (case-insensitive groups, \p{Lu}...), its rewrite is
# used, because it is what llama.cpp actually runs.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACT = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACT + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACT + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACT + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPERISH = r"((?=[\p{L}])([^a-z]))"          # a letter that is not ASCII lower case
_LOWERISH = r"((?=[\p{L}])([^A-Z]))"          # a letter that is not ASCII upper case
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?" + _UPPERISH + "*" + _LOWERISH + r"+|[^\r\n\p{L}\p{N}]?" + _UPPERISH
           + "+" + _LOWERISH + r"*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?" + _UPPERISH + "*" + _LOWERISH + "+" + _CONTRACT
          + r"?|[^\r\n\p{L}\p{N}]?" + _UPPERISH + "+" + _LOWERISH + "*" + _CONTRACT
          + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM = [                             # (escaped: NFC would fold some range ends)
    r"[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134"
    "\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
]
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"


class _Pre:
    """One llama.cpp pre-tokenizer type: regexes plus the vocab flags it sets."""

    def __init__(self, regexes, clean_spaces=True, ignore_merges=False, add_bos=False, no_bos=False):
        self.regexes = list(regexes)
        self.clean_spaces = clean_spaces      # llama.cpp clean_spaces (clean_up_tokenization_spaces)
        self.ignore_merges = ignore_merges    # a word that is itself a token is not merged
        self.add_bos = add_bos                # default for add_bos before the GGUF key overrides it
        self.no_bos = no_bos                  # the type clears the BOS id (chatglm)


_P_DEFAULT = _Pre([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"])
_P_LLAMA3 = _Pre([_LLAMA3], ignore_merges=True, add_bos=True)
_P_STARCODER = [r"\p{N}", _GPT2]

PRE_TOKENIZERS: dict[str, _Pre] = {"default": _P_DEFAULT}
for _n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
           "jina-v5-nano"):
    PRE_TOKENIZERS[_n] = _P_LLAMA3
for _n in ("dbrx", "smaug-bpe"):
    PRE_TOKENIZERS[_n] = _Pre([_LLAMA3])
PRE_TOKENIZERS["deepseek-llm"] = _Pre(_DEEPSEEK_LLM, clean_spaces=False)
PRE_TOKENIZERS["deepseek-coder"] = _Pre(
    [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"], clean_spaces=False)
for _n in ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"):
    PRE_TOKENIZERS[_n] = _Pre(_DEEPSEEK3, clean_spaces=False)
PRE_TOKENIZERS["falcon"] = _Pre([r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"])
for _n in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
    PRE_TOKENIZERS[_n] = _Pre(_P_STARCODER)
for _n in ("command-r", "smollm"):
    PRE_TOKENIZERS[_n] = _Pre(_P_STARCODER, clean_spaces=False)
for _n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
           "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4", "jina-v1-en", "jina-v2-code",
           "roberta-bpe"):
    PRE_TOKENIZERS[_n] = _Pre([_GPT2])
for _n in ("trillion", "granite-docling"):
    PRE_TOKENIZERS[_n] = _Pre([_GPT2], clean_spaces=False)
for _n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"):
    PRE_TOKENIZERS[_n] = _Pre([_QWEN2], clean_spaces=False)
for _n in ("stablelm2", "megrez"):
    PRE_TOKENIZERS[_n] = _Pre([_QWEN2])
PRE_TOKENIZERS["qwen35"] = _Pre([_QWEN35], clean_spaces=False)
PRE_TOKENIZERS["poro-chat"] = _Pre([_BLOOM], clean_spaces=False)
for _n in ("bloom", "gpt3-finnish"):
    PRE_TOKENIZERS[_n] = _Pre([_BLOOM])
PRE_TOKENIZERS["viking"] = _Pre([_BLOOM, r"\p{N}"], clean_spaces=False)
for _n in ("glm4", "chatglm-bpe"):
    PRE_TOKENIZERS[_n] = _Pre([_LLAMA3], no_bos=True)
PRE_TOKENIZERS["tekken"] = _Pre([_TEKKEN], clean_spaces=False, ignore_merges=True, add_bos=True)
for _n in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"):
    PRE_TOKENIZERS[_n] = _Pre([_GPT4O], clean_spaces=False)
PRE_TOKENIZERS["chameleon"] = _Pre(
    [r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", r"\p{N}",
     r"[\p{P}!-/:-@\[-`{-~]", _GPT2], clean_spaces=False, add_bos=True)
for _n in ("bailingmoe", "bailingmoe2", "llada-moe"):
    PRE_TOKENIZERS[_n] = _Pre(
        [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"], clean_spaces=False)
PRE_TOKENIZERS["seed-coder"] = _Pre(
    [_CONTRACT + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
     r"|\s+(?!\S)|\s+"], clean_spaces=False)


# ---- GPT-2 byte <-> unicode mapping (byte-level BPE) -------------------------------------------

def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable code points."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


BYTE_TO_UNICODE = _byte_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}


# ---- sentencepiece ModelProto, serialized by hand ----------------------------------------------
# Protobuf wire format: key = (field_number << 3) | wire_type; wire types 0 = varint,
# 2 = length-delimited, 5 = 32-bit. Only the fields sentencepiece needs at inference are written.

def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _pb_varint(field: int, v: int) -> bytes:
    return _varint(field << 3 | 0) + _varint(v)


# sentencepiece_model.proto: ModelProto.SentencePiece.Type
SP_NORMAL, SP_UNKNOWN, SP_CONTROL, SP_USER_DEFINED, SP_UNUSED, SP_BYTE = 1, 2, 3, 4, 5, 6


def spm_model_proto(pieces: list[str], scores, sp_types: list[int], *, add_dummy_prefix: bool,
                    byte_fallback: bool) -> bytes:
    """Serialize a sentencepiece ModelProto for a BPE model.

    pieces: piece strings (n); scores: float merge priorities (n); sp_types: SP_* per piece (n).
    Fields: ModelProto{1: pieces{1: piece, 2: score (float), 3: type}, 2: trainer_spec{3: model_type
    = BPE (2), 35: byte_fallback}, 3: normalizer_spec{1: name, 3: add_dummy_prefix,
    4: remove_extra_whitespaces, 5: escape_whitespaces}}.
    """
    parts = []
    pack_f = struct.Struct("<f").pack
    for p, s, t in zip(pieces, scores, sp_types):
        pb = p.encode("utf-8")
        body = b"\x0a" + _varint(len(pb)) + pb + b"\x15" + pack_f(float(s)) + b"\x18" + _varint(t)
        parts.append(b"\x0a" + _varint(len(body)) + body)
    trainer = _pb_varint(3, 2) + _pb_varint(35, int(byte_fallback))
    normalizer = (_pb_bytes(1, b"identity") + _pb_varint(3, int(add_dummy_prefix))
                  + _pb_varint(4, 0) + _pb_varint(5, 1))
    parts.append(_pb_bytes(2, trainer))
    parts.append(_pb_bytes(3, normalizer))
    return b"".join(parts)


def _is_byte_piece(t: str) -> bool:
    return len(t) == 6 and t.startswith("<0x") and t.endswith(">") and \
        all(c in "0123456789ABCDEFabcdef" for c in t[3:5])


# ---- helpers on GGUF metadata ------------------------------------------------------------------

def _md_int(md, key):
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, (list, tuple, np.ndarray)):
        return None
    if isinstance(v, (str, bytes, float)):
        raise ModelFormatError(f"[tokenizer] {key} must be an integer, got {v!r}")
    return int(v)


def _md_str(md, key):
    """A string key's value, "" when missing or not a string (e.g. an array)."""
    v = md.get(key)
    return v if isinstance(v, str) else ""


def _md_bool(md, key, default):
    v = md.get(key)
    if v is None or isinstance(v, (list, tuple, np.ndarray)):
        return default
    return bool(v)


def _md_list(md, key):
    v = md.get(key)
    if v is None:
        return None
    if not isinstance(v, (list, tuple, np.ndarray)):
        raise ModelFormatError(f"[tokenizer] {key} must be an array, got {type(v).__name__} {v!r:.40}")
    return v


def _md_array(md, key, n, dtype, lo, hi):
    """A numeric per-token array key (None when missing): at least n values of dtype within [lo, hi]."""
    v = _md_list(md, key)
    if v is None:
        return None
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise ModelFormatError(f"[tokenizer] {key} must be an array of numbers") from None
    if a.ndim != 1 or len(a) < n:
        raise ModelFormatError(f"[tokenizer] {key} must have one value per token ({n}), got shape {a.shape}")
    if np.isnan(a).any() or a.min(initial=lo) < lo or a.max(initial=hi) > hi:
        raise ModelFormatError(f"[tokenizer] {key} has values outside [{lo}, {hi}]")
    return a.astype(dtype)


class Tokenizer:
    """A llama.cpp-compatible tokenizer. Build it with Tokenizer.from_gguf(metadata).

    Public fields: vocab_type ("spm" | "bpe"), pre (str), n_vocab, bos_id, eos_id, eot_id, eom_id,
    unk_id, pad_id (int or None), add_bos, add_eos, add_space_prefix, clean_spaces, eog_ids.
    """

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, metadata: dict) -> "Tokenizer | None":
        """Build from a GGUF metadata dict; None when the model has no vocabulary."""
        model = metadata.get("tokenizer.ggml.model")
        if model is not None and not isinstance(model, str):
            raise ModelFormatError(f"[tokenizer] tokenizer.ggml.model must be a string, got {type(model).__name__}")
        if model is None or model in ("none", "no_vocab"):
            return None
        if model == "llama":
            return cls(metadata, "spm")
        if model == "gpt2":
            return cls(metadata, "bpe")
        raise ModelFormatError(f"[tokenizer] unsupported tokenizer.ggml.model '{model}' "
                               "(supported: llama, gpt2, none)")

    def __init__(self, md: dict, vocab_type: str):
        self.vocab_type = vocab_type
        tokens = _md_list(md, "tokenizer.ggml.tokens")
        if tokens is None:
            raise ModelFormatError("[tokenizer] missing tokenizer.ggml.tokens")
        tokens = [str(t) for t in tokens]
        n = len(tokens)
        for i, t in enumerate(tokens):          # as llama.cpp: never an empty piece
            try:                                # (the GGUF reader keeps invalid bytes as surrogates)
                t.encode("utf-8")
            except UnicodeEncodeError:
                raise ModelFormatError(f"[tokenizer] token {i} is not valid UTF-8: "
                                       f"{t.encode('utf-8', 'surrogateescape')!r:.60}") from None
            if t == "":
                log.warning("tokenizer: empty token at index %d", i)
                tokens[i] = f"[EMPTY_{i}]"
        self.n_vocab = n
        self._tokens = tokens                                      # (n,) raw vocab strings
        self._tok2id = {}
        for i, t in enumerate(tokens):
            if t in self._tok2id:
                raise ModelFormatError(f"[tokenizer] duplicate token in vocabulary: {t!r} has ids "
                                       f"{self._tok2id[t]} and {i}")
            self._tok2id[t] = i

        scores = _md_array(md, "tokenizer.ggml.scores", n, np.float32, -np.inf, np.inf)
        self._scores = np.zeros(n, np.float32) if scores is None else scores  # (n,) merge priorities (SPM)
        types = _md_array(md, "tokenizer.ggml.token_type", n, np.int32, -2**31, 2**31 - 1)
        types = np.full(n, TT_NORMAL, np.int32) if types is None else types
        self._types = types[:n]                                    # (n,) GGUF token types
        attr = [_TYPE_TO_ATTR.get(int(t), A_UNDEFINED) for t in self._types.tolist()]

        self.pre = _md_str(md, "tokenizer.ggml.pre")
        # ---- flags and default ids per vocab type (llama_vocab::impl::load) ----
        if vocab_type == "spm":
            bos, eos, unk = 1, 2, 0
            self.add_space_prefix, self.add_bos, self.add_eos = True, True, False
            self.clean_spaces, ignore_merges = False, False
            pre = None
        else:
            bos, eos, unk = 11, 11, None
            self.add_space_prefix, self.add_bos, self.add_eos = False, False, False
            if not self.pre:
                log.warning("tokenizer: missing tokenizer.ggml.pre; using 'default' -- generation "
                            "quality will be degraded, consider regenerating the model")
                pre = _P_DEFAULT
            elif self.pre in PRE_TOKENIZERS:
                pre = PRE_TOKENIZERS[self.pre]
            else:
                log.warning("tokenizer: UNKNOWN pre-tokenizer type '%s'; using 'default' -- "
                            "tokenization will differ from the model's and quality may degrade",
                            self.pre)
                pre = _P_DEFAULT
            self.clean_spaces, ignore_merges = pre.clean_spaces, pre.ignore_merges
            self.add_bos = pre.add_bos
            if pre.no_bos:
                bos = None
        self.add_space_prefix = _md_bool(md, "tokenizer.ggml.add_space_prefix", self.add_space_prefix)

        ids = {"bos": bos, "eos": eos, "eot": None, "eom": None, "unk": unk, "sep": None,
               "pad": None, "mask": None, "fim_pre": None, "fim_suf": None, "fim_mid": None,
               "fim_pad": None, "fim_rep": None, "fim_sep": None}
        keys = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
                "eom": "eom_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
                "pad": "padding_token_id", "mask": "mask_token_id", "fim_pre": "fim_pre_token_id",
                "fim_suf": "fim_suf_token_id", "fim_mid": "fim_mid_token_id",
                "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id",
                "fim_sep": "fim_sep_token_id"}
        for name, key in keys.items():
            if ids[name] is not None and ids[name] >= n:
                ids[name] = None
            v = _md_int(md, "tokenizer.ggml." + key)
            if v is None:
                continue
            if 0 <= v < n:
                ids[name] = v
            else:
                log.warning("tokenizer: bad special token %s = %d, using default %s", key, v, ids[name])
        self.add_bos = _md_bool(md, "tokenizer.ggml.add_bos_token", self.add_bos)
        self.add_eos = _md_bool(md, "tokenizer.ggml.add_eos_token", self.add_eos)
        if self.add_bos and ids["bos"] is None:
            raise ModelFormatError("[tokenizer] add_bos_token is true but bos_token_id is not set")
        if self.add_eos and ids["eos"] is None:
            raise ModelFormatError("[tokenizer] add_eos_token is true but eos_token_id is not set")

        # ---- tokens recognised by text: EOT/EOM/FIM, forced to control ----
        def force_control(i):
            if not attr[i] & A_CONTROL:
                log.warning("tokenizer: control-looking token %d %r was not control-type; "
                            "treating it as control", i, tokens[i])
                attr[i] |= A_CONTROL

        def find_text(slot, texts):
            if ids[slot] is not None:
                return
            for t in texts:
                i = self._tok2id.get(t)
                if i is not None:
                    ids[slot] = i
                    force_control(i)
                    return

        find_text("eot", EOT_TEXTS)
        find_text("eom", EOM_TEXTS)
        for k, texts in FIM_TEXTS.items():
            find_text("fim_" + k, texts)
        for i in range(n):                          # control tokens named "unused" are unused
            if attr[i] & A_CONTROL and "unused" in tokens[i]:
                attr[i] |= A_UNUSED

        eog = set(ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None)
        for t in EOG_TEXTS:
            i = self._tok2id.get(t)
            if i is not None:
                eog.add(i)
                force_control(i)
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):   # gpt-oss
            i = self._tok2id.get(t)
            if i is not None:
                attr[i] = A_USER_DEFINED
        for k in ("eos", "eot", "eom"):
            if ids[k] is not None:
                eog.add(ids[k])
        # o200k_harmony / solar-open: "<|end|>" is not an end of generation there
        texts = {tokens[i] for i in eog}
        if "<|end|>" in texts and ((("<|return|>" in texts) and ("<|call|>" in texts or "<|calls|>" in texts))
                                   or ("<|calls|>" in texts or "<|call|>" in texts) and "<|flush|>" in texts):
            i = self._tok2id["<|end|>"]
            eog.discard(i)
            attr[i] = A_USER_DEFINED
        # gemma4 / plamo: "</s>" is a normal token there
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            i = self._tok2id["</s>"]
            eog.discard(i)
            attr[i] = A_NORMAL

        # phi-3: special tokens swallow the whitespace after them (llama.cpp sets RSTRIP by name)
        name = _md_str(md, "general.name").lower()
        if "phi-3" in name or "phi3" in name:
            for i in range(n):
                if attr[i] & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN):
                    attr[i] |= A_RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                i = self._tok2id.get(t)
                if i is not None:
                    attr[i] = attr[i] | A_RSTRIP if on else attr[i] & ~A_RSTRIP

        self._attr = attr                                          # (n,) llama_token_attr bits
        self.bos_id, self.eos_id, self.eot_id, self.eom_id = ids["bos"], ids["eos"], ids["eot"], ids["eom"]
        self.unk_id, self.pad_id, self.sep_id = ids["unk"], ids["pad"], ids["sep"]
        self.fim_ids = {k[4:]: v for k, v in ids.items() if k.startswith("fim_") and v is not None}
        self.eog_ids = frozenset(i for i in eog if 0 <= i < n)

        # ---- piece table: token_to_piece(special=True) bytes per id ----
        self._pieces = self._build_pieces()                        # (n,) bytes
        self._hidden = [bool(a & _A_SPECIAL) for a in attr]        # (n,) not shown unless unparse_special

        # ---- special-token partition table: longest text first (stable by id) ----
        spec = [i for i in range(n) if attr[i] & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN)]
        spec.sort(key=lambda i: -len(tokens[i]))
        self._spec = [(tokens[i], i, bool(attr[i] & A_LSTRIP), bool(attr[i] & A_RSTRIP),
                       bool(attr[i] & _A_SPECIAL)) for i in spec]
        self._spec_index = {}                                      # first 2 chars -> positions in _spec
        for k, (t, *_rest) in enumerate(self._spec):
            self._spec_index.setdefault(t[:2], []).append(k)

        # ---- the core BPE engine ----
        if vocab_type == "spm":
            self._build_spm()
        else:
            self._build_bpe(md, pre, ignore_merges)

    def _build_pieces(self) -> list[bytes]:
        out = []
        spm = self.vocab_type == "spm"
        for i, (t, a) in enumerate(zip(self._tokens, self._attr)):
            if a & (_A_SPECIAL | A_USER_DEFINED):
                out.append(t.encode("utf-8"))
            elif a & A_NORMAL:
                if spm:
                    out.append(t.replace(SPM_SPACE, " ").encode("utf-8"))
                else:
                    out.append(_bpe_decode_text(t))
            elif a & A_BYTE:
                try:
                    out.append(bytes([int(t[3:5], 16)]))
                except ValueError:
                    out.append(b"")
            else:                                   # unused / undefined: render as nothing
                out.append(b"")
        return out

    def _build_spm(self):
        import sentencepiece as spm

        tokens, attr, n = self._tokens, self._attr, self.n_vocab
        byte_ids = [i for i in range(n) if attr[i] & A_BYTE and _is_byte_piece(tokens[i])]
        byte_fallback = len({tokens[i].upper() for i in byte_ids}) == 256
        vocab = self._tok2id

        @lru_cache(maxsize=None)
        def reachable(t: str) -> bool:            # can llama.cpp's merges build this text?
            if len(t) == 1:
                return t in vocab
            if t not in vocab:
                return False
            return any(reachable(t[:k]) and reachable(t[k:]) for k in range(1, len(t)))

        sp_types = [SP_NORMAL] * n
        for i in range(n):
            a = attr[i]
            if a & A_BYTE and byte_fallback and _is_byte_piece(tokens[i]):
                sp_types[i] = SP_BYTE
            elif a & (A_CONTROL | A_UNKNOWN) and not a & A_NORMAL:
                try:
                    built = reachable(tokens[i])
                except RecursionError:              # a token of thousands of characters
                    built = False
                sp_types[i] = SP_NORMAL if built else SP_CONTROL
        pieces = list(tokens)
        scores = self._scores[:n].tolist()
        unk = self.unk_id
        if unk is not None and sp_types[unk] != SP_BYTE:
            sp_types[unk] = SP_UNKNOWN
        else:                                       # sentencepiece needs exactly one unknown piece
            pieces.append("<llmrt_unk>")
            scores.append(0.0)
            sp_types.append(SP_UNKNOWN)
        proto = spm_model_proto(pieces, scores, sp_types, add_dummy_prefix=self.add_space_prefix,
                                byte_fallback=byte_fallback)
        self.spm_proto = proto                      # the ModelProto bytes, for inspection/export
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=proto)
        except RuntimeError as e:                   # e.g. a piece with a NUL character
            raise ModelFormatError(f"[tokenizer] sentencepiece rejects this vocabulary: {e}") from None
        n_sp = self._sp.get_piece_size()
        if n_sp != len(pieces):
            raise ModelFormatError(f"[tokenizer] sentencepiece loaded {n_sp} pieces, expected {len(pieces)}")

    def _build_bpe(self, md, pre: _Pre, ignore_merges: bool):
        from tokenizers import Regex
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers

        merges_md = _md_list(md, "tokenizer.ggml.merges")
        if merges_md is None:
            raise ModelFormatError("[tokenizer] cannot find tokenizer.ggml.merges in model file")
        vocab = self._tok2id
        merges, seen = [], set()
        for m in merges_md:
            m = str(m)
            j = m.find(" ", 1)
            if j < 0:
                continue
            pair = (m[:j], m[j + 1:])
            if pair in seen or pair[0] + pair[1] not in vocab or pair[0] not in vocab or pair[1] not in vocab:
                continue                            # llama.cpp keeps the first rank of a pair
            seen.add(pair)
            merges.append(pair)
        self._n_merges = len(merges)
        bpe = models.BPE(vocab=dict(vocab), merges=merges, ignore_merges=ignore_merges,
                         fuse_unk=False, byte_fallback=False)
        hf = HFTokenizer(bpe)
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
        splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(splits)
        self._hf = hf

    # ---- vocabulary queries ---------------------------------------------------------------
    def _id(self, i) -> int:
        """i as a token id of this vocabulary: TypeError for a non-integer, ValueError outside
        [0, n_vocab) (a negative id is not counted from the end)."""
        if not is_int(i):
            raise TypeError(f"a token id must be an int, got {i!r} ({type(i).__name__})")
        if not 0 <= i < self.n_vocab:
            raise ValueError(f"token id {i} is out of range for a vocabulary of {self.n_vocab}")
        return int(i)

    def id_to_token(self, i: int) -> str:
        """The raw vocabulary string of token i (SPM pieces keep '▁', BPE pieces keep 'Ġ')."""
        return self._tokens[self._id(i)]

    def token_to_id(self, text: str) -> int | None:
        """The id of the vocabulary entry spelled exactly `text`, or None."""
        return self._tok2id.get(text)

    def token_to_piece(self, i: int) -> bytes:
        """Raw bytes of one token as llama_token_to_piece(special=True) gives them: SPM '▁' as ' ',
        byte tokens as their byte, BPE byte-level pieces mapped back to bytes, control tokens as
        their text, unused tokens as b''."""
        return self._pieces[self._id(i)]

    def piece_table(self) -> tuple[list, list]:
        """(pieces, special): token_to_piece(i) and is_special(i) of every id i, as two lists
        indexed by id (the tokenizer's own: read them, do not change them)."""
        return self._pieces, self._hidden

    def is_special(self, i: int) -> bool:
        """True for control and unknown tokens: hidden by decode(skip_special=True) and only
        produced by encode(parse_special=True)."""
        return self._hidden[self._id(i)]

    def is_eog(self, i: int) -> bool:
        return self._id(i) in self.eog_ids

    def token_attr(self, i: int) -> int:
        """llama_token_attr bit flags of token i (A_* constants)."""
        return self._attr[self._id(i)]

    def __len__(self) -> int:
        return self.n_vocab

    # ---- encode -----------------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list:
        """Cut special-token texts out of `text` (llama.cpp tokenizer_st_partition).

        Returns a list of str (raw text) and int (token id) fragments. Longest special texts are
        cut first; user-defined tokens always, control/unknown tokens only with parse_special."""
        idx = self._spec_index
        cand = set()
        for k in {text[j:j + 2] for j in range(len(text))} | set(text):
            lst = idx.get(k)
            if lst:
                cand.update(lst)
        if not cand:
            return [text] if text else []
        frags = [text] if text else []
        for k in sorted(cand):
            stext, sid, lstrip, rstrip, hidden = self._spec[k]
            if hidden and not parse_special:
                continue
            if stext not in text:
                continue
            out = []
            for f in frags:
                if type(f) is not str or stext not in f:
                    out.append(f)
                    continue
                pos = 0
                while True:
                    j = f.find(stext, pos)
                    if j < 0:
                        break
                    left = f[pos:j]
                    if lstrip:
                        left = left.rstrip(_C_ISSPACE)
                    if left:
                        out.append(left)
                    out.append(sid)
                    pos = j + len(stext)
                    if rstrip:
                        while pos < len(f) and f[pos] in _C_ISSPACE:
                            pos += 1
                if pos < len(f):
                    out.append(f[pos:])
            frags = out
        return frags

    def _encode_text(self, text: str) -> list[int]:
        if self.vocab_type == "spm":
            return self._sp.EncodeAsIds(text)       # dummy prefix + '▁' escaping inside
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special).

        add_special: add BOS / EOS when the model's add_bos / add_eos flags say so.
        parse_special: also turn control-token texts (e.g. "<|im_start|>") into their ids; leave it
        False for user text, so it can never produce control ids (user-defined tokens such as
        Gemma's "<table>" are always recognised, as in llama.cpp)."""
        if not isinstance(text, str):
            raise TypeError(f"[tokenizer.encode] text must be str, got {type(text).__name__}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:     # a lone surrogate: neither engine takes it
                raise ValueError(f"[tokenizer.encode] text has an unpaired UTF-16 surrogate "
                                 f"(\\u{ord(text[e.start]):04x} at character {e.start}): not valid "
                                 f"Unicode") from None
        out = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        for f in self._partition(text, parse_special):
            if type(f) is int:
                out.append(f)
            else:
                out.extend(self._encode_text(f))
        if add_special and self.add_bos and len(out) >= 2 and out[1] == self.bos_id:
            log.warning("tokenizer: the prompt starts with BOS and add_special added another: 2 BOS")
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    # ---- decode -----------------------------------------------------------------------------
    def _check_id(self, i: int):
        if not 0 <= i < self.n_vocab:
            raise ValueError(f"[tokenizer.decode] token id {i} out of range [0, {self.n_vocab})")

    def decode_bytes(self, ids, skip_special: bool = False) -> bytes:
        """decode() before UTF-8 decoding: exactly the bytes llama_detokenize writes."""
        return self.detokenize(ids, remove_special=skip_special, unparse_special=not skip_special)

    def detokenize(self, ids, remove_special: bool, unparse_special: bool) -> bytes:
        """llama_detokenize(ids, remove_special, unparse_special) with both flags free: bytes.
        ids: a sequence of token ids, or one id (as Hugging Face's decode takes it)."""
        ids = [int(ids)] if np.ndim(ids) == 0 else [int(i) for i in ids]
        unparse = unparse_special
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        pieces, hidden = self._pieces, self._hidden
        for i in ids:
            self._check_id(i)
            p = b"" if (hidden[i] and not unparse) else pieces[i]
            if remove_space:
                if p[:1] == b" ":
                    p = p[1:]
                remove_space = False
            parts.append(p)
        raw = b"".join(parts)
        if self.clean_spaces:
            c = _SpaceCleaner()
            raw = c.feed(raw) + c.finish()
        return raw

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of `ids`, as llama.cpp's llama_detokenize(ids, remove_special=skip_special,
        unparse_special=not skip_special), then UTF-8 decoded with errors="replace".

        skip_special=False (default, = common_detokenize(special=true)): control tokens are shown
        as their text. skip_special=True: control/unknown tokens render as nothing and a leading
        BOS / trailing EOS added by add_special is dropped.
        As llama.cpp: when add_space_prefix, one leading space of the first token's piece is
        removed (the SPM dummy prefix) -- the first token is the BOS when there is one, so after
        a BOS the space stays unless skip_special removes that BOS first; clean_spaces models get
        llama.cpp's clean-up of " ." / " ' " / " 's" etc.
        (llama-cpp-python's Llama.detokenize differs: it joins llama_token_to_piece(special=False)
        pieces, so control tokens vanish, and drops one leading space only after a leading BOS;
        llmrt follows the C API llama_detokenize / common_detokenize.)"""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")


def _bpe_decode_text(t: str) -> bytes:
    """Byte-level BPE piece -> bytes (llama_decode_text, including its [UNK_BYTE_..] marker)."""
    try:
        return bytes(UNICODE_TO_BYTE[c] for c in t)
    except KeyError:
        pass
    out = bytearray()
    for c in t:
        b = UNICODE_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + t.encode("utf-8") + b"]"
    return bytes(out)


# ---- clean_up_tokenization_spaces, streaming ----------------------------------------------------
# llama.cpp (llama_vocab::impl::detokenize, clean_spaces) runs three in-place passes over the text:
#   1. drop a space before one of ? ! . ,
#   2. " ' " -> "'" (drops both spaces; the dropped right space no longer counts as a space)
#   3. drop the space in " 's", " 'm", " 're", " 've"
# Each pass reads at most 2 bytes ahead and may drop the byte it wrote just before, so each is a
# small streaming transducer: it holds back a trailing space (might be dropped) and waits for
# lookahead only after a " '". decode() and IncrementalDetokenizer share this code.

class _Pass:
    def __init__(self, kind: int):
        self.kind = kind
        self.inp = bytearray()     # input not processed yet
        self.out = bytearray()     # output not released yet (the last byte may still be dropped)
        self.prev = -1             # input byte before inp[0] as the pass sees it (-1: at start)
        self.started = False

    def _step(self, final: bool) -> None:
        inp, out, kind = self.inp, self.out, self.kind
        i, n = 0, len(inp)
        while i < n:
            x = inp[i]
            if not self.started:
                out.append(x)
                self.started = True
                self.prev = x
                i += 1
                continue
            prev = self.prev
            if kind == 1:
                if prev == 0x20 and x in b"?!.,":
                    out.pop()
                out.append(x)
                self.prev = x
                i += 1
            elif kind == 2:
                if x == 0x27 and prev == 0x20:
                    if i + 1 >= n and not final:
                        break                      # need to see the byte after the apostrophe
                    if i + 1 < n and inp[i + 1] == 0x20:
                        out.pop()
                        out.append(x)
                        self.prev = 0              # the dropped space reads as NUL afterwards
                        i += 2
                        continue
                out.append(x)
                self.prev = x
                i += 1
            else:
                if x == 0x27 and prev == 0x20:
                    if i + 2 >= n and not final:
                        break                      # need up to two bytes after the apostrophe
                    if i + 1 < n:
                        x1 = inp[i + 1]
                        if x1 in b"sm":
                            out.pop()
                        elif x1 not in b"td" and i + 2 < n:
                            if (x1, inp[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):   # 're, 've
                                out.pop()
                out.append(x)
                self.prev = x
                i += 1
        del inp[:i]

    def feed(self, data: bytes, final: bool = False) -> bytes:
        self.inp += data
        self._step(final)
        if final:
            r = bytes(self.out)
            self.out.clear()
            return r
        keep = 1 if self.out[-1:] == b" " else 0   # a trailing space may still be dropped
        r = bytes(self.out[:len(self.out) - keep])
        del self.out[:len(self.out) - keep]
        return r


class _SpaceCleaner:
    def __init__(self):
        self.p = [_Pass(1), _Pass(2), _Pass(3)]

    def feed(self, data: bytes) -> bytes:
        for p in self.p:
            data = p.feed(data)
        return data

    def finish(self) -> bytes:
        data = b""
        for p in self.p:
            data = p.feed(data, final=True)
        return data


class IncrementalDetokenizer:
    """Streaming decode: put(id) returns the text completed by that token; flush() the rest.

    The concatenation of everything returned equals tokenizer.decode(all ids, skip_special).
    Works on bytes: O(1) per token (the piece, a UTF-8 decoder holding at most 3 bytes of an
    unfinished character, and for clean_spaces models a few held-back bytes). Never returns a
    partial character: a multi-byte character split over byte-fallback tokens comes out whole
    with the token that completes it."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False, continuation: bool = False):
        """continuation=True: the ids continue a sequence decoded elsewhere (e.g. generated tokens
        after a prompt), so the first one is not treated as the start of the text: its SPM
        leading space is kept and no BOS is dropped. Then the output equals
        decode(prefix + ids)[len(decode(prefix)):] for any prefix that starts with a
        non-stripped token, instead of decode(ids)."""
        self.tok = tokenizer
        self.skip_special = skip_special
        self.continuation = continuation
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._clean = _SpaceCleaner() if tokenizer.clean_spaces else None
        self._first = not continuation              # no token seen yet
        self._remove_space = tokenizer.add_space_prefix and not continuation
        self._held_eos = False                      # a trailing EOS that skip_special may drop

    def _emit(self, raw: bytes, final: bool = False) -> str:
        if self._clean is not None:
            raw = self._clean.feed(raw) + (self._clean.finish() if final else b"")
        return self._utf8.decode(raw, final)

    def _piece(self, i: int) -> bytes:
        tok = self.tok
        p = b"" if (tok._hidden[i] and self.skip_special) else tok._pieces[i]
        if self._remove_space:
            if p[:1] == b" ":
                p = p[1:]
            self._remove_space = False
        return p

    def put(self, i: int) -> str:
        tok = self.tok
        i = int(i)
        tok._check_id(i)
        raw = b""
        if self._first:
            self._first = False
            if self.skip_special and tok.add_bos and i == tok.bos_id:
                self._remove_space = False
                return ""
        if self._held_eos:
            self._held_eos = False
            raw += self._piece(tok.eos_id)
        if self.skip_special and tok.add_eos and i == tok.eos_id:
            self._held_eos = True                   # dropped if it turns out to be the last token
            return self._emit(raw) if raw else ""
        raw += self._piece(i)
        return self._emit(raw)

    def flush(self) -> str:
        """Return whatever is still held back; the stream ends here (a held EOS is dropped) and
        the detokenizer is ready for a new stream."""
        self._held_eos = False
        r = self._emit(b"", final=True)
        self.__init__(self.tok, self.skip_special, self.continuation)
        return r
