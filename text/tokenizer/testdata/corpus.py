"""A varied, seeded text generator for tokenizer fixtures and the benchmark:
English prose and code, CJK, Japanese kana, Hangul (precomposed and as
jamo), Arabic, Hindi, emoji (ZWJ sequences, skin tones, flags, keycaps),
combining marks (decomposed accents), ligatures and fullwidth forms,
whitespace runs (tabs, CR LF, U+00A0, U+0085, U+2028, U+3000), digit runs,
contractions in every case (and the long s), text that looks like special
tokens, and valid UTF-8 at the edges (U+FEFF, U+FFFD, U+FFFF, U+D7FF,
U+E000, U+10FFFF, 4-byte letters)."""
import random

WORDS = ("the of and to in is was for that with as on by at from this be are it an or which "
         "model expert router token layer weight gradient batch learning rate mixture sparse dense "
         "attention softmax norm training checkpoint shard tensor memory device host stream").split()
CJK = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー"
HANGUL = "안녕하세요 세계 토큰 모델 전문가 학습 데이터"
ARABIC = "مرحبا بالعالم هذا نص عربي للاختبار مع أرقام ١٢٣ و ٤٥٦"
HINDI = "नमस्ते दुनिया यह हिंदी पाठ है"
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "🇯🇵", "1️⃣", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "🤖", "✨"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u1100\u1161\u11a8", "i\u0307", "Å", "Å"]
COMPAT = ["ﬁ", "ﬂ", "ＡＢＣ", "１２３", "㍿", "½", "²", "Ⅻ", "ｶﾞ", "ⓐ"]
SPACES = ["  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u0085", "\u2028", "\u3000", "\u2003", "\x0b", "\x0c", "    \n"]
EDGES = ["\ufeff", "\ufffd", "\uffff", "\ud7ff", "\ue000", "\U0010ffff", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0001f600", "\x00", "\x7f", "\u200b", "\u200d"]
CONTRACTIONS = ["it's", "IT'S", "we're", "They'VE", "I'm", "you'll", "he'd", "don't", "ſ's", "'S", "'ll've"]
SPECIAL_LIKE = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<think>", "</think>",
                "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|start|>", "<|message|>", "<|end|>", "<mask>",
                "<|im_end", "|im_end|>", "<<s>>", "<0x41>", "▁", "▁▁x"]
CODE = ["def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; i++) { a[i] += b[i]; }",
        "SELECT id, name FROM users WHERE age >= 21;", "x = {'a': [1, 2.5e-3, None]}", "if (a&&b||!c) {}\n\t}\n",
        "<div class=\"x\">&amp;</div>", "path/to/file_name.py:123", "0xDEADBEEF + 1_000_000", "https://example.com/a?b=c"]


def digits(r):
    return "".join(r.choice("0123456789") for _ in range(r.randint(1, 12)))


def sentence(r):
    n = r.randint(3, 14)
    words = [r.choice(WORDS) for _ in range(n)]
    if r.random() < 0.3:
        words[0] = words[0].capitalize()
    if r.random() < 0.2:
        words[-1] = words[-1].upper()
    return " ".join(words) + r.choice([".", "!", "?", ",", ";", "", "..."])


PIECES = [
    lambda r: sentence(r),
    lambda r: sentence(r),
    lambda r: "".join(r.choice(CJK) for _ in range(r.randint(2, 20))),
    lambda r: "".join(r.choice(KANA) for _ in range(r.randint(2, 12))),
    lambda r: HANGUL if r.random() < 0.5 else "\u1112\u1161\u11ab\u1100\u1173\u11af",
    lambda r: ARABIC,
    lambda r: HINDI,
    lambda r: "".join(r.choice(EMOJI) for _ in range(r.randint(1, 4))),
    lambda r: r.choice(COMBINING) + r.choice(WORDS),
    lambda r: r.choice(COMPAT),
    lambda r: r.choice(SPACES),
    lambda r: r.choice(EDGES),
    lambda r: r.choice(CONTRACTIONS),
    lambda r: r.choice(SPECIAL_LIKE),
    lambda r: r.choice(CODE),
    lambda r: digits(r),
    lambda r: "%d.%d%%" % (r.randint(0, 999), r.randint(0, 99)),
]


def text(r, max_pieces=8):
    parts = []
    for _ in range(r.randint(1, max_pieces)):
        parts.append(r.choice(PIECES)(r))
        parts.append(r.choice(["", " ", " ", " ", "\n", "  "]))
    return "".join(parts)


def corpus(seed, n, max_pieces=8):
    r = random.Random(seed)
    return [text(r, max_pieces) for _ in range(n)]
