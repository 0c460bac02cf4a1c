"""Fold lesson text into the forms the safety screen matches, so that disguise does not help.

A phrase like "Ignore all previous instructions" can be written so that a plain regex misses it
while a model still reads it: zero-width characters or soft hyphens inside words, Cyrillic or Greek
look-alike letters, fullwidth or mathematical letters, accents, leetspeak ("1gn0r3"), letters spaced
or dotted apart ("i g n o r e", "i.g.n.o.r.e"), and the words run together ("IGNORE-ALL-PREVIOUS").
The screen (`distill.lessons.safety`) matches every pattern against each of these forms:

- `visible(text)`: the text without format characters (Unicode category Cf: zero-width spaces and
  joiners, soft hyphens, bidirectional controls, tag characters) and other invisible marks
  (variation selectors, the combining grapheme joiner). This is also what an accepted lesson keeps:
  the screen never rewrites the visible text otherwise (NFKC would turn "x²" into "x2").
- `folded(text)`: NFKC (fullwidth, mathematical and circled letters become ASCII), accents removed,
  case folded, whitespace collapsed. Patterns in other languages are matched here.
- `latinised(text)`: `folded` with look-alike letters mapped to Latin (a small table of our own,
  below; no network, no Unicode data files) and letter runs that were spaced or dotted apart joined
  again. English patterns are matched here (and with punctuation between letters removed) and on:
- `deleeted(text)`: `latinised` with leetspeak digits and symbols read as letters, inside words that
  also hold a letter, once with "1" read as "i" and once as "l".
- `squashed(text)`: letters only, for a few phrases that are attacks however they are split.
- `scrambled(text)`: `latinised` read backwards, with each word read backwards, and in ROT13: a model
  asked to "read this backwards" or "apply rot13" reads what a forward regex misses.

`mixed_script_word(text)` finds a word that mixes Latin with Cyrillic, Armenian or Cherokee letters,
which ordinary text never does (Greek is left out: "πr²" is ordinary mathematics).
"""

from __future__ import annotations

import codecs
import re
import unicodedata

# Look-alikes of Latin letters, upper and lower case (applied after NFKC and before case folding).
_CONFUSABLE_PAIRS = (
    # Cyrillic
    "АA аa ВB вb ЕE еe ЁE ёe КK кk МM мm НH нh ОO оo РP рp СC сc ТT тt УY уy ХX хx ЅS ѕs ІI іi ЇI їi "
    "ЈJ јj ԚQ ԛq ԜW ԝw ԁd һh ӏl ЬB ьb ГR гr ПN пn ИN иu ЗE зe ЧY чy ШW шw"
    # Greek
    " ΑA αa ΒB βb ΕE εe ΖZ ζz ΗH ηn ΙI ιi ΚK κk ΜM μu ΝN νv ΟO οo ΡP ρp ΤT τt ΥY υu ΧX χx ωw γy ϲc ϳj"
    # Armenian, Cherokee, Latin small capitals and IPA letters
    " օo սu ոn հh ցg ԱU ՍU ՕO ᎪA ᏴB ᏟC ᎬE ᎻH ᏆI ᏦK ᎷM ᏢP ᏚS ᏔW ᎩY ᏃZ"
    " ᴀa ʙb ᴄc ᴅd ᴇe ꜰf ɢg ʜh ɪi ᴊj ᴋk ʟl ᴍm ɴn ᴏo ᴘp ʀr ꜱs ᴛt ᴜu ᴠv ᴡw ʏy ᴢz ɑa ɡg ɩi ıi ȷj ℓl"
)
_CONFUSABLES = str.maketrans({pair[0]: pair[1] for pair in _CONFUSABLE_PAIRS.split()})
_LEET = {
    "0": "o",
    "3": "e",
    "4": "a",
    "5": "s",
    "7": "t",
    "8": "b",
    "9": "g",
    "@": "a",
    "$": "s",
    "!": "i",
    "|": "l",
    "+": "t",
    "€": "e",
}
_LEET_I = str.maketrans({**_LEET, "1": "i"})
_LEET_L = str.maketrans({**_LEET, "1": "l"})
_LEET_TOKEN = re.compile(r"[\w@$!|+€]+")
_HAS_LETTER = re.compile(r"[a-z]")
_INVISIBLE_EXTRA = {0x034F, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800}  # CGJ, Hangul fillers, Braille blank
_SPACED_RUN = re.compile(r"(?<![^\W\d_])(?:[^\W\d_][\s.\-_*·•~^]{1,3}){3,}[^\W\d_](?![^\W\d_])")
_SPACES = re.compile(r"\s+")
_SUSPECT_SCRIPTS = ("CYRILLIC", "ARMENIAN", "CHEROKEE")
_WORD = re.compile(r"[^\W\d_]+")


def _invisible(ch: str) -> bool:
    code = ord(ch)
    return (
        unicodedata.category(ch) == "Cf"
        or code in _INVISIBLE_EXTRA
        or 0xFE00 <= code <= 0xFE0F
        or 0xE0100 <= code <= 0xE01EF
    )


def visible(text: str) -> str:
    """`text` without format characters and invisible marks; nothing else changes."""
    return "".join(ch for ch in text if not _invisible(ch))


def folded(text: str) -> str:
    """NFKC, no accents, case-folded, single spaces (after `visible`)."""
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", visible(text)))
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return _SPACES.sub(" ", unicodedata.normalize("NFC", plain).casefold()).strip()


def latinised(text: str) -> str:
    """`folded` with look-alike letters read as Latin and split-up words joined again."""
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", visible(text)))
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    latin = _SPACES.sub(" ", plain.translate(_CONFUSABLES).casefold()).strip()
    return _SPACED_RUN.sub(lambda m: re.sub(r"[\s.\-_*·•~^]", "", m.group()), latin)


def deleeted(text: str) -> tuple[str, str]:
    """`latinised` with leetspeak read as letters inside words: ("1" as "i", "1" as "l")."""
    latin = latinised(text)

    def read(table: dict[int, str]) -> str:
        return _LEET_TOKEN.sub(
            lambda m: m.group().translate(table) if _HAS_LETTER.search(m.group()) else m.group(), latin
        )

    return read(_LEET_I), read(_LEET_L)


def squashed(text: str) -> str:
    """Letters only (of the leetspeak reading with "1" as "i"), for phrases that are attacks however split."""
    return re.sub(r"[^a-z]", "", deleeted(text)[0])


def scrambled(text: str) -> tuple[str, str, str]:
    """`latinised` reversed, with every word reversed in place, and in ROT13."""
    latin = latinised(text)
    return latin[::-1], " ".join(word[::-1] for word in latin.split(" ")), codecs.encode(latin, "rot13")


def mixed_script_word(text: str) -> str | None:
    """A word of `text` that mixes Latin letters with Cyrillic, Armenian or Cherokee ones, or None."""
    for match in _WORD.finditer(unicodedata.normalize("NFKC", visible(text))):
        word = match.group()
        scripts = {unicodedata.name(ch, "?").split(" ")[0] for ch in word}
        if "LATIN" in scripts and scripts & set(_SUSPECT_SCRIPTS):
            return word
    return None
