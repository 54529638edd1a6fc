#!/usr/bin/env python3
"""Build lilac's tokenizer test corpus: many scripts, emoji, code, numbers,
whitespace, contractions, NFC/NFD variants, added-token strings, random UTF-8.

Everything is generated here from word lists written in this file, Unicode
ranges, and (when present) text files of installed Python packages; nothing is
downloaded. The output is deterministic for a given seed and environment.

    python3 tools/corpus/build_corpus.py [--out tests/fixtures/gen/corpus.jsonl] [--mb 6]

Output: JSON lines {"cat": CATEGORY, "text": TEXT}, one document per line.
"""
import argparse
import json
import os
import random
import sys
import sysconfig
import unicodedata

# --------------------------------------------------------------------------
# Word lists (hand-written; a few dozen common words per language).

WORDS = {
    "en": "the of and to in is was that for it with as his on be at by had are but from or have an they which one you were her all she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three".split(),
    "en_caps": "The Of And To In Is Was That For It With As His On Be At By HAD ARE BUT FROM OR HAVE AN THEY WHICH ONE YOU WERE HER ALL SHE There Would Their We Him Been Has When Who Will More No If Out So Said What Up".split(),
    "fr": "le la les de des du et à un une est être avoir que qui dans pour pas sur au avec ce il elle ne se plus par je tu nous vous ils mais ou où son sa ses été fait très même aussi bien après avant déjà hôtel forêt garçon français naïve noël cœur œuvre là-bas aujourd’hui qu’il c’est l’été d’accord ça élève être fenêtre château île".split(),
    "de": "der die das und ist nicht ein eine zu den mit von für auf dem sich des auch es als an nach wie im für über größer Straße Mädchen Brücke schön Käse Übung Ärger Öl fünf weiß Fußgängerübergänge Donaudampfschifffahrtsgesellschaft müssen können möchte während".split(),
    "es": "el la los las de y en que a un una es por con para no se su al lo como más pero sus le ya o este sí porque esta entre cuando muy sin sobre también me hasta hay donde quien desde todo nos durante todos uno les ni contra otros ese eso ante ellos e esto mí antes algunos qué unos yo otro otras otra él tanto esa estos mucho quienes nada muchos cual poco ella estar estas algunas algo nosotros mañana niño año corazón canción pingüino ¿qué? ¡hola!".split(),
    "pt": "não é são você também até já está três coração ação informação português pão mãe irmã avô avó órgão função então porém além através".split(),
    "vi": "Việt Nam tiếng người của không những được một trong cho với này có là và đã các để khi đến từ nhiều thì ra làm nước thế giới học sinh Hà Nội Sài Gòn phở bánh mì chúng tôi".split(),
    "pl": "że się nie jest na to w z do co jak ale tak już przez może być bardzo który gdzie źródło łódź żółć gęś zażółć jaźń Kraków Gdańsk Wrocław Łódź".split(),
    "cs": "že se je na to v a s do co jak ale tak už přes může být velmi který kde Příliš žluťoučký kůň úpěl ďábelské ódy řeka čeština".split(),
    "tr": "bir ve bu da de için ile ne çok daha gibi olan kadar ama sonra İstanbul ılık ışık şeker çiçek öğrenci güzel ağaç Iğdır iyi".split(),
    "ro": "și în că este să nu cu pe la din care mai pentru acest fost țară știință învățământ România".split(),
    "is": "það og að er í á ekki við sem fyrir með þetta hann hún þeir Þórður ævintýri".split(),
    "ru": "и в не на я быть он с что а по это она этот к но они мы как из у который то за свой что весь год от так о для ты же все тот мочь вы человек такой его сказать только или ещё бы себя один как уже до время если сам когда другой вот говорить наш мой знать стать при чтобы дело жизнь кто первый очень два день её новый рука даже во со раз где там под можно ну какой после их работа без самый потом надо хотеть ли слово идти большой должен место иметь ничто Москва Санкт-Петербург ёлка съёмка подъезд".split(),
    "uk": "і в не на що як з та до це але за від він вона так його її ми ви вони їх є був була Київ Україна ґанок їжак єнот".split(),
    "bg": "и в не на да се че с за от по е как това са но ще като Българския щастие ъгъл".split(),
    "sr": "и у је да се на за са не као од што из Београд ђак ћуп љубав њива џеп".split(),
    "el": "και το η να του της σε με για που τα ο την από είναι δεν οι στο θα τον στην ως Αθήνα ελληνικά γλώσσα ευχαριστώ καλημέρα ψυχή ωραίο ΆΈΉΊΌΎΏ ϊϋΐΰ άέήίόύώ".split(),
    "ar": "في من على إلى أن هذا التي الذي مع عن كان هذه بين كل لا ما هو قد بعد ذلك العربية مرحبا السلام عليكم شكرا كتاب مدرسة الْعَرَبِيَّةُ مُحَمَّدٌ".split(),
    "fa": "و در به از که این را با است برای آن یک خود تا کرد بر هم نیز گفت می‌شود فارسی".split(),
    "ur": "کے میں کی ہے اور کو سے پر یہ نے اردو پاکستان".split(),
    "he": "של את על זה לא כי עם הוא גם אני מה אבל או היא יש כל עברית שלום תודה בְּרֵאשִׁית בָּרָא אֱלֹהִים".split(),
    "hi": "के है में की और को से का एक यह हैं पर भी नहीं कि था तो हो गया कर लिए हिन्दी नमस्ते धन्यवाद भारत विद्यालय क्षत्रिय ज्ञान श्री".split(),
    "mr": "आणि आहे या व ते हे त्या मराठी महाराष्ट्र".split(),
    "bn": "এবং একটি এই করে হয় থেকে জন্য বাংলা ভাষা আমি তুমি".split(),
    "ta": "ஒரு மற்றும் இந்த என்று அது தமிழ் வணக்கம் நன்றி கொண்டு".split(),
    "te": "ఒక మరియు ఈ అని తెలుగు భాష నమస్కారం".split(),
    "kn": "ಮತ್ತು ಒಂದು ಈ ಕನ್ನಡ ನಮಸ್ಕಾರ".split(),
    "ml": "ഒരു എന്ന ഈ മലയാളം നമസ്കാരം".split(),
    "gu": "અને એક આ ગુજરાતી".split(),
    "pa": "ਅਤੇ ਇੱਕ ਇਹ ਪੰਜਾਬੀ".split(),
    "th": "ที่ และ ใน การ เป็น ของ ได้ มี ไม่ ให้ ว่า จะ นี้ ภาษาไทย สวัสดี ขอบคุณ กรุงเทพมหานคร ประเทศไทย".split(),
    "lo": "ແລະ ໃນ ພາສາລາວ".split(),
    "km": "និង ក្នុង ភាសាខ្មែរ".split(),
    "my": "နှင့် မြန်မာ ဘာသာ".split(),
    "ka": "და არის ეს ის რომ ქართული ენა გამარჯობა".split(),
    "hy": "և է այս որ հայերեն լեզու բարև".split(),
    "am": "እና ነው ይህ አማርኛ ሰላም".split(),
    "zh": "的 一 是 不 了 人 我 在 有 他 这 中 大 来 上 国 个 到 说 们 为 子 和 你 地 出 道 也 时 年 得 就 那 要 下 以 生 会 自 着 去 之 过 家 学 对 可 她 里 后 小 么 心 多 天 而 能 好 都 然 没 日 于 起 还 发 成 事 只 作 当 想 看 文 无 开 手 十 用 主 行 方 又 如 前 所 本 见 经 头 面 公 同 三 已 老 从 动 两 长 知识 中华人民共和国 北京 上海 计算机 人工智能 語言 繁體中文 臺灣".split(),
    "ja": "の に は を た が で て と し れ さ ある いる も する から な こと として い や れる など なっ ない この ため その あっ よう また もの という あり まで られ なる へ か だ これ によって により おり より による ず なり られる において ば なかっ なく しかし について せ だっ その後 できる それ う ので なお のみ でき き つ における および いう さらに でも ら たり その他 に関する たち ます ん なら 日本語 東京 ひらがな カタカナ コンピュータ ﾊﾝｶｸ".split(),
    "ko": "이 그 저 것 수 등 들 및 에서 으로 를 을 가 는 은 의 에 와 과 도 한국어 안녕하세요 감사합니다 서울 대한민국 컴퓨터 프로그래밍 사랑해".split(),
    "mn": "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ Монгол хэл".split(),
    "bo": "བོད་ཡིག་ ཀྱི་ དང་".split(),
    "si": "සහ මෙම සිංහල".split(),
    "ne": "र छ यो नेपाली".split(),
    "yi": "און דער די ייִדיש".split(),
    "syr": "ܠܫܢܐ ܣܘܪܝܝܐ".split(),
    "dv": "ދިވެހި ބަސް".split(),
    "chr": "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ".split(),
    "iu": "ᐃᓄᒃᑎᑐᑦ ᑐᓴᐅᑎ".split(),
}

PUNCT = list(".,;:!?") + ["...", "…", " — ", " – ", "-", "(", ")", "[", "]", "\"", "'", "«", "»", "“", "”", "‘", "’", "。", "、", "！", "？", "؟", "،", "।", "॥", "·", "•"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]


def all_cases(s):
    """Every upper/lower-case variant of s (s is short)."""
    out = [""]
    for ch in s:
        if ch.isalpha():
            out = [o + c for o in out for c in (ch.lower(), ch.upper())]
        else:
            out = [o + ch for o in out]
    return out


def sentence(rng, lang, n_words=None):
    words = WORDS[lang]
    n = n_words or rng.randint(3, 18)
    out = []
    for i in range(n):
        w = rng.choice(words)
        if i == 0 and rng.random() < 0.5 and w[:1].isalpha():
            w = w[:1].upper() + w[1:]
        out.append(w)
        if rng.random() < 0.08:
            out.append(rng.choice(PUNCT))
    sep = "" if lang in ("zh", "ja") and rng.random() < 0.7 else " "
    end = rng.choice([".", ".", ".", "!", "?", "。" if lang in ("zh", "ja") else "."])
    return sep.join(out) + end


def prose(rng, target):
    langs = [l for l in WORDS if l != "en_caps"]
    parts, size = [], 0
    while size < target:
        lang = rng.choice(langs)
        para = " ".join(sentence(rng, lang) for _ in range(rng.randint(1, 6)))
        if rng.random() < 0.3:  # mix two languages in one paragraph
            para += " " + sentence(rng, rng.choice(langs))
        para += rng.choice(["\n", "\n\n", "\r\n", "\r\n\r\n", " ", "\n\n\n"])
        parts.append(para)
        size += len(para.encode())
    return "".join(parts)


def contractions(rng, target):
    parts, size = [], 0
    subjects = ["it", "he", "she", "that", "there", "what", "who", "John", "IT", "HE", "They", "we", "you", "I", "i"]
    while size < target:
        c = rng.choice(CONTRACTIONS)
        v = rng.choice(all_cases(c))
        apos = rng.choice(["'", "'", "'", "’", "ʼ", "`"])
        v = apos + v[1:]
        s = rng.choice(subjects) + v + rng.choice([" ", "", ".", "!", "s", "x ", "'", "''"])
        if rng.random() < 0.1:
            s = rng.choice(["'ſ", "'ſ ", "'K", "'k", "'İ", "'ı", "'ß", "'Ⅿ"]) + " "
        if rng.random() < 0.1:
            s = "'" * rng.randint(1, 4) + rng.choice(["s", "S", "ll", "LL", "Ll", "re", "rE", "d", "D", "ve", "VE", "m", "M", "t", "T"])
        parts.append(s + rng.choice([" ", " ", "\n", "  "]))
        size += len(parts[-1].encode())
    return "".join(parts)


EMOJI_BASE = ["😀", "😂", "🥲", "😍", "🤔", "👍", "👋", "🙏", "🔥", "✨", "🎉", "❤", "💔", "🚀", "🌍", "🐍", "🦀", "🍕", "⚽", "🏳", "🏴", "☺", "✌", "☝", "✍", "♥", "⭐", "🀄", "🃏", "🧑", "👩", "👨", "👧", "👦", "🧒"]
SKIN = ["\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
ZWJ_SEQ = [
    "👨\u200d👩\u200d👧\u200d👦", "👩\u200d❤\ufe0f\u200d💋\u200d👨", "🏳\ufe0f\u200d🌈", "🏴\u200d☠\ufe0f", "👩\U0001F3FD\u200d💻",
    "🧑\u200d🚀", "👨\u200d👨\u200d👦", "🐻\u200d❄\ufe0f", "❤\ufe0f\u200d🔥", "🧔\u200d♀\ufe0f", "👁\ufe0f\u200d🗨\ufe0f",
    "🏃\u200d♂\ufe0f\u200d➡\ufe0f", "🫱\U0001F3FB\u200d🫲\U0001F3FF",
]
FLAGS = ["🇺🇸", "🇫🇷", "🇯🇵", "🇩🇪", "🇧🇷", "🇮🇳", "🇨🇳", "🇺🇦", "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"]
KEYCAPS = [d + "\ufe0f\u20e3" for d in "0123456789#*"]


def emoji(rng, target):
    parts, size = [], 0
    while size < target:
        r = rng.random()
        if r < 0.3:
            e = rng.choice(EMOJI_BASE)
            if rng.random() < 0.3:
                e += rng.choice(SKIN)
            if rng.random() < 0.2:
                e += "\ufe0f"
        elif r < 0.55:
            e = rng.choice(ZWJ_SEQ)
        elif r < 0.7:
            e = rng.choice(FLAGS)
        elif r < 0.8:
            e = rng.choice(KEYCAPS)
        else:
            e = sentence(rng, rng.choice(["en", "fr", "zh", "ja", "ru"]), rng.randint(2, 6))
        sep = rng.choice(["", " ", " ", "\n", "  ", "\u200d", "!"])
        parts.append(e * rng.choice([1, 1, 1, 2, 3]) + sep)
        size += len(parts[-1].encode())
    return "".join(parts)


def combining(rng, target):
    parts, size = [], 0
    marks = [chr(c) for c in range(0x300, 0x370)] + [chr(c) for c in range(0x1AB0, 0x1ABF)] + [chr(c) for c in range(0x1DC0, 0x1E00)] + [chr(c) for c in range(0x20D0, 0x20F1)] + [chr(c) for c in range(0xFE20, 0xFE30)]
    base = "aeiouAEIOUcnszCNSZyYwWxXgGkK"
    while size < target:
        r = rng.random()
        if r < 0.3:  # NFD of accented prose
            s = unicodedata.normalize("NFD", sentence(rng, rng.choice(["fr", "de", "vi", "pl", "cs", "el", "es", "pt", "ko", "ro"])))
        elif r < 0.45:  # Zalgo stacks
            s = "".join(ch + "".join(rng.choice(marks) for _ in range(rng.randint(0, 6))) for ch in rng.choice(WORDS["en"]) * 2)
        elif r < 0.55:  # marks out of canonical order, marks at the start, marks after spaces/digits
            s = rng.choice(["", " ", "1", "\n", "-"]) + "".join(rng.choice(marks) for _ in range(rng.randint(1, 4))) + rng.choice(base) + "\u0323\u0307" + "\u0307\u0323"
        elif r < 0.65:  # Hangul jamo (compose under NFC), compatibility chars (singletons)
            s = "".join(rng.choice(["\u1100\u1161", "\u1100\u1161\u11a8", "\u110b\u1175", "\uac00\u11a8", "\u212b", "\u2126", "\u212a", "\u1f71", "\u0344", "\u0958", "\uf900", "\uf9d0", "\ufa10", "\U0002F800", "\u0f73", "\u0f75", "\u1e9b\u0323", "Å", "Å", "Ω"]) for _ in range(rng.randint(2, 10)))
        elif r < 0.75:  # Indic / Hebrew / Arabic / Thai marks
            s = rng.choice([
                "क्षत्रिय ज्ञान श्रीमान् हिंदी क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़",
                "בְּרֵאשִׁית בָּרָא אֱלֹהִים אֵת הַשָּׁמַיִם וְאֵת הָאָרֶץ",
                "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ",
                "กรุงเทพมหานคร อมรรัตนโกสินทร์ มหินทรายุธยา น้ำ ผู้ใหญ่",
                "அ஁ ௌ ொ ோ கொ கோ கௌ",
                "ো ৌ কো কৌ",
                "ཀྵ ཱི ཱུ",
                "각 한국어 ᄒᆞᆫ",
            ])
            if rng.random() < 0.5:
                s = unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFC", "NFKC"]), s)
        elif r < 0.85:  # combining after punctuation and numbers, enclosing marks
            s = rng.choice(["1\u20e3", "a\u20dd", "!\u0301", "9\u0338", "=\u0338", "<\u0338", "\u00a0\u0301", "\t\u0300x", "\u3000\u0301", "_\u0332_\u0332", "A\u030a", "a\u0328\u0301"]) * rng.randint(1, 5)
        else:  # mixed normalization forms of the same words
            w = rng.choice(WORDS[rng.choice(["fr", "vi", "el", "de", "ko"])])
            s = " ".join(unicodedata.normalize(f, w) for f in ("NFC", "NFD", "NFKC", "NFKD"))
        parts.append(s + rng.choice([" ", "\n", "", ". "]))
        size += len(parts[-1].encode())
    return "".join(parts)


CODE_SNIPPETS = [
    'def {f}(x, y=None):\n    """Return {f} of x."""\n    if y is None:\n        y = {{}}\n    for i in range(len(x)):\n        y[i] = x[i] ** 2 + {n}\n    return y\n\n',
    'class {F}(object):\n    def __init__(self, *args, **kwargs):\n        super().__init__()\n        self._{f} = kwargs.get("{f}", {n})\n\n    @property\n    def {f}(self) -> int:\n        return self._{f}\n\n',
    '#include <stdio.h>\n\nint {f}(int argc, char **argv) {{\n\tfor (int i = 0; i < argc; i++) {{\n\t\tprintf("%s\\n", argv[i]);\n\t}}\n\treturn {n};\n}}\n\n',
    'static inline uint32_t {f}(const uint8_t *p, size_t n) {{\n    uint32_t h = 0x{n:08x}u;\n    while (n--) h = (h ^ *p++) * 16777619u;\n    return h;\n}}\n',
    'function {f}(a, b) {{\n  const r = a.map((x) => x * {n}).filter(Boolean);\n  return r.length > 0 ? r : [b];\n}}\nexport default {f};\n',
    'fn {f}<T: Clone>(v: &[T]) -> Vec<T> {{\n    let mut out = Vec::with_capacity(v.len());\n    for x in v.iter() {{ out.push(x.clone()); }}\n    out\n}}\n',
    'func {F}(ctx context.Context, n int) (int, error) {{\n\tif n < {n} {{\n\t\treturn 0, fmt.Errorf("too small: %d", n)\n\t}}\n\treturn n * 2, nil\n}}\n',
    'public static int {f}(String[] args) throws IOException {{\n        Map<String, List<Integer>> m = new HashMap<>();\n        return m.size() + {n};\n    }}\n',
    'SELECT u.id, u.name, COUNT(o.id) AS n_orders\nFROM users u LEFT JOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= \'2024-01-{d:02d}\' AND u.score > {n}\nGROUP BY u.id, u.name\nORDER BY n_orders DESC;\n',
    '#!/usr/bin/env bash\nset -euo pipefail\nfor f in "$@"; do\n  if [[ -f "$f" ]]; then echo "${{f%.txt}}: $(wc -l < "$f")"; fi\ndone\n',
    '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{F}</title></head>\n<body>\n  <div class="{f}" id="x{n}">&amp; &lt;tag&gt; &#x1F600;</div>\n</body>\n</html>\n',
    '{{"name": "{f}", "version": "1.{n}.0", "deps": {{"a": "^2.0", "b": null}}, "list": [1, 2.5, -3e10, true, false]}}\n',
    '    # comment with trailing spaces    \n\t\t// tab-indented comment\n        x = [1,2,3]  ;  y = {{ "k" : \'v\' }}\n',
    'template <typename T>\nstd::vector<T> {f}(const std::vector<T>& v) {{\n    std::vector<T> r; r.reserve(v.size());\n    std::copy_if(v.begin(), v.end(), std::back_inserter(r), [](const T& x) {{ return x > {n}; }});\n    return r;\n}}\n',
    '\\begin{{equation}}\n  \\int_0^\\infty e^{{-x^2}}\\,dx = \\frac{{\\sqrt{{\\pi}}}}{{2}} \\quad ({n})\n\\end{{equation}}\n',
    'diff --git a/{f}.c b/{f}.c\n@@ -1,{n} +1,{n} @@\n-    old_line();\n+    new_line();\n',
    'regex = r"^(?P<{f}>[A-Za-z_][A-Za-z0-9_]*)\\s*=\\s*(\\d+|\'[^\']*\')$"\n',
]


def code(rng, target, extra_files):
    parts, size = [], 0
    names = ["foo", "bar", "compute_total", "parseHeader", "my_func", "x", "helper2", "ProcessData", "_private", "__init__", "getValue", "set_value_of_the_thing"]
    while size < target:
        if extra_files and rng.random() < 0.35:
            path = rng.choice(extra_files)
            try:
                with open(path, encoding="utf-8") as fh:
                    txt = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            if len(txt) > 6000:
                st = rng.randrange(0, len(txt) - 6000)
                txt = txt[st:st + 6000]
            s = txt
        else:
            f = rng.choice(names)
            s = rng.choice(CODE_SNIPPETS).format(f=f, F=f[:1].upper() + f[1:], n=rng.randint(0, 10 ** rng.randint(1, 9)), d=rng.randint(1, 28))
            if rng.random() < 0.2:
                s = s.replace("\n", "\r\n")
            if rng.random() < 0.2:
                s = s.replace("    ", "\t")
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


def numbers(rng, target):
    parts, size = [], 0
    digit_sets = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯", "０１２３４５６７８９", "๐๑๒๓๔๕๖๗๘๙", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗"]
    while size < target:
        r = rng.random()
        if r < 0.3:
            s = str(rng.randint(0, 10 ** rng.randint(1, 30)))
        elif r < 0.45:
            s = f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
        elif r < 0.55:
            s = rng.choice(["+1 (555) 123-4567", "2024-02-29T23:59:60Z", "192.168.0.1", "v1.2.3-rc.4", "1,234,567.89", "1.234.567,89", "3.14e-10", "0xDEADBEEF", "0b1010_1010", "12:30:45", "50%", "$1,000", "€20", "¥3000", "1st 2nd 3rd 4th", "x²+y³=z⁴", "½ ¼ ¾ ⅓", "Ⅻ ⅻ Ⅳ ↀ", "①②③ ⑴⑵", "〇一二三"])
        elif r < 0.75:
            ds = rng.choice(digit_sets)
            s = "".join(rng.choice(ds) for _ in range(rng.randint(1, 20)))
        else:
            s = sentence(rng, rng.choice(["en", "de", "zh", "ar"])) + " " + str(rng.randint(0, 99999))
        parts.append(s + rng.choice([" ", "\n", ", ", "; ", ""]))
        size += len(parts[-1].encode())
    return "".join(parts)


WS = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2000", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f", "\u1680", "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", "\u180e", "\u200b", "\ufeff", "\x1c", "\x1d", "\x1e", "\x1f"]


def whitespace(rng, target):
    parts, size = [], 0
    while size < target:
        r = rng.random()
        if r < 0.3:
            s = " " * rng.randint(1, 300)
        elif r < 0.45:
            s = rng.choice(["\n", "\r\n", "\t", " \n", "\n ", " \r\n "]) * rng.randint(1, 50)
        elif r < 0.7:
            s = "".join(rng.choice(WS) for _ in range(rng.randint(1, 30)))
        else:
            s = rng.choice(WORDS[rng.choice(["en", "ru", "zh", "ar", "hi"])])
        parts.append(s)
        if rng.random() < 0.5:
            parts.append(rng.choice(WORDS["en"]) + rng.choice(["", "!", "123"]))
        size += sum(len(p.encode()) for p in parts[-2:])
    return "".join(parts)


def random_utf8(rng, target, assigned_only):
    parts, size = [], 0
    ranges = [(0x20, 0x7F), (0xA0, 0x2FF), (0x370, 0x3FF), (0x400, 0x52F), (0x590, 0x6FF), (0x900, 0xDFF), (0xE00, 0xEFF),
              (0x1000, 0x10FF), (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0x3400, 0x4DBF),
              (0x4E00, 0x9FFF), (0xA000, 0xA4CF), (0xAC00, 0xD7A3), (0xF900, 0xFAFF), (0xFB00, 0xFFFD),
              (0x10000, 0x1007F), (0x10300, 0x1034F), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF)]
    while size < target:
        n = rng.randint(1, 200)
        cs = []
        for _ in range(n):
            if assigned_only:
                a, b = rng.choice(ranges)
                c = rng.randint(a, b - 1)
                # stay inside Unicode 14 (PCRE2 10.42): unassigned-then code points excluded
                if unicodedata.category(chr(c)) == "Cn":
                    c = 0x61
            else:
                c = rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])
                if 0xD800 <= c <= 0xDFFF:
                    c = 0xFFFD
            cs.append(chr(c))
        s = "".join(cs)
        parts.append(s + rng.choice(["", " ", "\n"]))
        size += len(parts[-1].encode())
    return "".join(parts)


ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
         "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
         "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
         "<tool_response>", "</tool_response>", "<think>", "</think>"]


def added_tokens(rng, target):
    parts, size = [], 0
    while size < target:
        r = rng.random()
        if r < 0.4:
            s = rng.choice(ADDED)
        elif r < 0.55:  # partial / broken ones
            a = rng.choice(ADDED)
            s = rng.choice([a[:-1], a[1:], a[: len(a) // 2], a.upper(), a.replace("|", "｜"), "<" + a, a + ">", a[:3] + " " + a[3:]])
        elif r < 0.7:  # adjacent / nested
            s = "".join(rng.choice(ADDED) for _ in range(rng.randint(2, 5)))
            if rng.random() < 0.5:
                s = "<" + s + ">"
        elif r < 0.85:  # chat-like
            s = f"<|im_start|>{rng.choice(['user', 'assistant', 'system'])}\n{sentence(rng, rng.choice(['en', 'zh', 'fr']))}<|im_end|>\n"
            if rng.random() < 0.3:
                s += "<|im_start|>assistant\n<think>\n" + sentence(rng, "en") + "\n</think>\n\n" + sentence(rng, "en")
        else:
            s = rng.choice(WORDS["en"]) + rng.choice(ADDED) + rng.choice(WORDS["en"])
        parts.append(s + rng.choice(["", " ", "\n", "  ", "\t"]))
        size += len(parts[-1].encode())
    return "".join(parts)


def edge_docs(rng):
    """Small and pathological documents, one each."""
    docs = ["", " ", "\n", "a", "é", "e\u0301", "\u0301", "\u0301a", "\r", "\r\n", "\n\r", "  \n\n  ", "'s", "'", "''", "x'", "😀", "\U0010FFFF",
            "\x00", "\x00a\x00", "\x7f", "\ufeff\ufeffhello", "\ufffd", "\ufffe\uffff", "\u200d", "\u200c", "\u2028",
            "a" * 100000, " " * 100000, "!" * 50000, "\n" * 50000, "ab" * 30000, "1" * 50000, "我" * 30000, "😀" * 10000,
            "\u0301" * 20000, "a" + "\u0301" * 5000, ("\r\n" * 20000), "\t" * 20000, "é" * 30000, "ÿ" * 20000,
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" * 50 + " the end",
            "Supercalifragilisticexpialidocious" * 200, "ThisIsAVeryLongCamelCaseIdentifierWithoutSpaces" * 100,
            "<|im_start|>" * 1000, "<|im_end|" * 1000, "<" * 10000, "|" * 10000]
    return docs


def package_files():
    """Text files shipped by installed packages (code and docs)."""
    out = []
    site = sysconfig.get_paths()["purelib"]
    for pkg in ("jinja2", "tokenizers", "markupsafe", "pytest", "_pytest", "huggingface_hub"):
        root = os.path.join(site, pkg)
        if not os.path.isdir(root):
            continue
        for dp, _, fns in os.walk(root):
            for fn in sorted(fns):
                if fn.endswith((".py", ".pyi", ".md", ".txt", ".rst")):
                    out.append(os.path.join(dp, fn))
    for fn in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        if fn.endswith(".dist-info"):
            m = os.path.join(site, fn, "METADATA")
            if os.path.isfile(m):
                out.append(m)
    return sorted(out)


def split_docs(rng, text, cat, lo=200, hi=8000):
    docs, i = [], 0
    while i < len(text):
        n = rng.randint(lo, hi)
        docs.append({"cat": cat, "text": text[i:i + n]})
        i += n
    return docs


def build(seed=1234, mb=6.0):
    rng = random.Random(seed)
    budget = int(mb * 1e6)
    share = {"prose": 0.30, "contractions": 0.04, "emoji": 0.06, "combining": 0.08, "code": 0.18, "numbers": 0.05,
             "whitespace": 0.05, "random_assigned": 0.08, "random_any": 0.04, "added": 0.04}
    pkg = package_files()
    docs = []
    gens = {
        "prose": lambda n: prose(rng, n),
        "contractions": lambda n: contractions(rng, n),
        "emoji": lambda n: emoji(rng, n),
        "combining": lambda n: combining(rng, n),
        "code": lambda n: code(rng, n, pkg),
        "numbers": lambda n: numbers(rng, n),
        "whitespace": lambda n: whitespace(rng, n),
        "random_assigned": lambda n: random_utf8(rng, n, True),
        "random_any": lambda n: random_utf8(rng, n, False),
        "added": lambda n: added_tokens(rng, n),
    }
    for cat, frac in share.items():
        docs += split_docs(rng, gens[cat](int(budget * frac)), cat)
    docs += [{"cat": "edge", "text": d} for d in edge_docs(rng)]
    # NFD/NFKC variants of some prose documents
    for d in rng.sample([d for d in docs if d["cat"] == "prose"], 60):
        docs.append({"cat": "normforms", "text": unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFKC"]), d["text"])})
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/gen/corpus.jsonl")
    ap.add_argument("--mb", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    docs = build(a.seed, a.mb)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=True) + "\n")
    os.replace(tmp, a.out)
    total = sum(len(d["text"].encode("utf-8", "surrogatepass")) for d in docs)
    print(f"corpus: {len(docs)} documents, {total / 1e6:.2f} MB -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
