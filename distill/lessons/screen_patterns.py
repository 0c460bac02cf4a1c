"""The patterns of the lesson screen: what `distill.lessons.safety` matches, and on which reading of an item.

What: compiled tables, each entry a pattern with its stable reason ("injection: ...", "link: ...", ...):
`INJECTION` (English, matched on every reading of `distill.lessons.confusables`), `OTHER_LANGUAGES` (nine
more, matched on the folded text), `SQUASHED` (letters only), `LINKS`, `SHELL`, `SECRETS`; and the single
patterns for chat-template control tokens (`CONTROL`), role markers (`ROLE`), hidden markup, bidirectional
and terminal control characters, lone surrogates and base64 runs.

Why a module of its own: the threat model, the order of the checks and the reasons they exist are
`distill.lessons.safety`'s docstring; this module is the vocabulary those checks read, long because attacks
come in many wordings, and kept apart so that the screen's logic reads in one sitting.
"""

from __future__ import annotations

import re

from distill.lessons import confusables

# Chat-template control tokens of the common families: ChatML / Qwen / Phi (<|...|>), Llama 2 ([INST],
# <<SYS>>), Llama 3 (<|start_header_id|> is covered by <|...|>), Gemma (<start_of_turn>), BOS/EOS/PAD.
CONTROL = re.compile(
    r"<\|(?:im_start|start_header_id)\|>\s*(?:system|user|assistant|tool|developer)?\b\s*:?"
    r"|<start_of_turn>\s*(?:user|model|system)?\b\s*:?"
    r"|<\|[^|<>\n]{0,40}\|>"
    r"|\[/?INST\]|<</?SYS>>"
    r"|</?s>|<bos>|<eos>|<pad>|<unk>|<mask>"
    r"|<end_of_turn>"
    r"|</?(?:think|thinking|reasoning)>"
    r"|^\s*#{2,}\s*(?:instruction|response|system|input)\s*:?",
    re.IGNORECASE | re.MULTILINE,
)
ROLE = re.compile(r"(?<![\w-])(?:system|assistant|user|human|developer)\s*:", re.IGNORECASE)

# Vocabulary of the English patterns (matched on the folded, latinised and leetspeak readings of an item).
_QUALIFIER = (
    r"(?:all|any|every|each|your|my|previous|previously|prior|above|aforementioned|earlier|preceding|foregoing|"
    r"original|initial|system|developer|safety|given|existing|old|current|default|standing|hidden)"
)
_RULES = (
    r"(?:instructions?|prompts?|rules|directions|guidelines|directives|constraints|guardrails|polic(?:y|ies)|"
    r"programming|training|orders|restrictions|guidance|system\s+(?:message|prompt)|"
    r"lessons?|experience\s+items?|advice|tips)"  # the lessons are the prompt's rules too
)
_NOT = r"(?<!don't )(?<!dont )(?<!do not )(?<!never )(?<!not )"
_DISOBEY = (
    rf"(?:{_NOT}(?:ignore|ignoring|disregard|disregarding|forget|forgetting|overlook|neglect|skip|dismiss|discard|"
    r"abandon)|override|overriding|bypass|bypassing|circumvent|pay\s+no\s+(?:attention|heed)\s+to|"
    r"(?:do\s+not|don'?t|never|stop|no\s+longer)\s+(?:follow|obey|heed|listen\s+to|following|obeying)|"
    r"set\s+aside|throw\s+out|cast\s+aside)"
)
_SAY = (
    r"(?:reveal|print|repeat|show|output|leak|disclose|display|dump|recite|reproduce|echo|copy|share|tell\s+me|"
    r"give\s+me|write\s+(?:out|down)|type\s+out|spell\s+out|translate|summari[sz]e|paraphrase|return|send|list|"
    r"quote|cite|restate|transcribe|read\s+(?:back|out))"
)
_ABOVE = (
    r"(?:above|so\s+far|verbatim|word\s+for\s+word|preceding|at\s+the\s+(?:top|start|beginning)|"
    r"before\s+this(?:\s+(?:line|lesson|message|point|item))?|earlier\s+in\s+(?:the|this)\s+(?:prompt|conversation|context))"
)
_SYSTEM = (
    r"(?:system|developer|hidden|secret|pre-?|meta-?)\s*(?:prompt|message|instructions?)|(?:initial|original)\s+prompt"
)
GAME_RULES = re.compile(  # "the cookbook's directions" are part of the game, not of the prompt
    r"\b(recipe|cookbook|game|puzzle|problem|question|task|map|quest|level|board|sokoban|frozenlake)('s)?\s+"
    r"(?:[\w-]+\s+)?(?:instructions?|rules|directions|guidelines)\b"
)
INJECTION = [
    (re.compile(p), why)
    for p, why in [
        (
            rf"\b{_DISOBEY}\s+(?:[\w',-]+\s+){{0,4}}?{_QUALIFIER}\s+(?:[\w',-]+\s+){{0,3}}?{_RULES}\b",
            "injection: ignore instructions",
        ),
        (
            (
                rf"\b{_DISOBEY}\s+(?:all\s+(?:of\s+)?)?the\s+(?:instructions?|prompts?|guidelines|directives|above)\b"
                r"(?!\s+(?:of|in|on|for|from)\s+the\s+(?:recipe|cookbook|game|map|box|problem|question))"
            ),
            "injection: ignore instructions",
        ),
        (
            (
                rf"\b{_DISOBEY}\s+(?:the\s+)?{_RULES}\s+(?:above|you\s+(?:were|have\s+been|got)\s+given|you\s+received|"
                r"so\s+far|before\s+this|of\s+the\s+system|from\s+the\s+(?:system|developer))"
            ),
            "injection: ignore instructions",
        ),
        (
            (
                rf"\b{_DISOBEY}\s+(?:all\s+(?:of\s+)?)?(?:everything|anything|all|what)\s+(?:you(?:'ve|\s+have|\s+were)?\s+"
                r"(?:been\s+)?(?:told|given|read|seen)|above|before\s+this|(?:said|written)\s+(?:above|before)|"
                r"that\s+came\s+before|so\s+far)|"
                rf"\b{_DISOBEY}\s+what\s+(?:the\s+)?(?:developer|system|operator|prompt)\s+(?:told|said|gave)"
            ),
            "injection: ignore instructions",
        ),
        (
            (
                rf"\b{_SAY}\s+(?:me\s+)?(?:back\s+)?(?:[\w'-]+\s+){{0,3}}?(?:system|hidden|secret|initial|original|developer|"
                r"full|entire|exact|complete|real|first|starting|your)\s+(?:prompt|instructions?|context|configuration|"
                r"guidelines|directives)\b"
            ),
            "injection: reveal the prompt",
        ),
        (
            (
                rf"\b{_SAY}\s+(?:me\s+)?(?:back\s+)?(?:[\w'-]+\s+){{0,3}}?(?:text|words|content|messages?|instructions|"
                r"lines|prompt|context|conversation|everything|paragraphs?|sentences?)\s+(?:(?:that\s+(?:is|was|were|are|"
                rf"came|comes|appears?)|written|you\s+(?:see|saw|were\s+given|received|read))\s+)?{_ABOVE}"
            ),
            "injection: reveal the prompt",
        ),
        (
            rf"\b{_SAY}\s+(?:[\w'-]+\s+){{0,6}}?(?:this|the)\s+(?:conversation|chat|context\s+window)\b",
            "injection: reveal the prompt",
        ),
        (rf"\b(?:{_SYSTEM})\b", "injection: addresses the system prompt"),
        (
            (
                r"\b(?:supersedes?|superseding|overrides?|overrule[sd]?|outranks?|trumps?|invalidates?|nullif(?:y|ies)|"
                r"takes?\s+(?:precedence|priority)\s+over|(?:has|have)\s+(?:precedence|priority)\s+over|prevails?\s+over|"
                r"(?:is|are)\s+more\s+important\s+than)\s+(?:[\w'-]+\s+){0,3}?(?:system|developer|instructions?|prompts?|"
                r"guidelines|directives|polic(?:y|ies)|safety|your\s+(?:rules|training|programming)|"
                r"(?:previous|prior|original|earlier|all\s+(?:other|previous|prior))\s+(?:rules|messages?|context))\b"
            ),
            "injection: claims priority",
        ),
        (
            (
                rf"\b{_QUALIFIER}\s+(?:[\w'-]+\s+){{0,2}}?{_RULES}\s+(?:are|is|have\s+been|has\s+been|were|was|became|"
                r"become|should\s+be|must\s+be)\s+(?:now\s+|hereby\s+|all\s+)?(?:obsolete|void|null|invalid|revoked|"
                r"cancell?ed|rescinded|outdated|superseded|overridden|deprecated|replaced|lifted|removed|suspended|"
                r"disabled|irrelevant|expired|retired|fake|no\s+longer\s+(?:valid|in\s+effect|in\s+force|binding|active))\b"
            ),
            "injection: instructions obsolete",
        ),
        (
            rf"\b{_RULES}\s+(?:above\s+|you\s+were\s+given\s+)?no\s+longer\s+appl(?:y|ies)\b",
            "injection: instructions obsolete",
        ),
        (
            (
                rf"\b{_RULES}\s+(?:(?:given|stated|written|provided|received)\s+)?(?:earlier|above|before|previously)\s+"
                r"(?:are|is|were|was)\s+(?:now\s+)?(?:obsolete|void|invalid|revoked|outdated|fake|false|wrong|a\s+test)\b|"
                r"\b(?:everything|all|the\s+text|what\s+you\s+read)\s+(?:above|before\s+this(?:\s+(?:line|point|message))?|"
                r"so\s+far)\s+(?:is|was|are|were)\s+(?:a\s+test|fake|false|irrelevant|void|wrong|not\s+real|a\s+joke|"
                r"a\s+trick|obsolete)\b"
            ),
            "injection: instructions obsolete",
        ),
        (
            (
                r"\b(?:these|this|the|our|my)\s+(?:lessons?|experience\s+items?|items?)\s+(?:are|is)\s+(?:now\s+)?(?:the\s+)?"
                r"(?:only|real|true|new|actual|highest|top|final)\s+(?:rules|instructions|priority|authority|orders)\b"
            ),
            "injection: claims priority",
        ),
        (
            (
                r"\bnew\s+(?:system\s+)?(?:instructions?|prompt|rules|directives?|orders)\s*:|"
                r"\byour\s+(?:real|true|actual|new|updated|only)\s+(?:instructions|rules|orders|directives|prompt)\b"
            ),
            "injection: new instructions",
        ),
        (
            (
                r"\b(?:system|admin|administrator|developer|root|sudo|operator)\s+(?:override|command|directive|notice|"
                r"update|alert|instruction|note)\s*:"
            ),
            "injection: authority claim",
        ),
        (
            (
                r"\byou\s+are\s+now\b(?!\s+(?:in|at|on|inside|outside|carrying|holding|facing|standing|next|near|back|ready|"
                r"able|done|closer|one|two|three|going|moving|stuck|in\s+front)\b)|"
                r"\bfrom\s+now\s+on\s*,?\s+(?:you\b|respond|reply|answer|act|behave|say|output|only\s+\w+|always\s+"
                r"(?:respond|reply|answer|say|output))"
            ),
            "injection: persona switch",
        ),
        (
            (
                r"\b(?:pretend|imagine|suppose|roleplay|role[\s-]?play|act|behave)\s+(?:that\s+)?(?:to\s+be|you\s+are|"
                r"you're|you\s+were|as\s+if\s+you\s+(?:are|were)|as|like)\s+(?:an?\s+|the\s+)?(?:[\w'-]+\s+){0,3}?"
                r"(?:ai|model|assistant|chatbot|bot|llm|gpt|persona|character|entity)\b"
            ),
            "injection: persona switch",
        ),
        (
            (
                r"\b(?:unrestricted|unfiltered|uncensored|jailbroken|amoral|unethical|evil|rogue|unaligned)\s+"
                r"(?:ai|model|assistant|chatbot|bot|llm|gpt|mode|persona|version)\b|"
                r"\b(?:act|behave|respond)\s+as\s+(?:an?\s+)?(?:unrestricted|unfiltered|uncensored)\b|"
                r"\b(?:ai|model|assistant|chatbot|llm|persona|character|version|yourself)\b[^.;]{0,40}?\b(?:without|no|"
                r"free\s+(?:of|from)|unbound\s+by|not\s+bound\s+by)\s+(?:any\s+|all\s+|your\s+)?(?:restrictions|"
                r"limitations|limits|filters?|censorship|guidelines|ethics|morals|moderation|content\s+polic(?:y|ies)|"
                r"guardrails|safeguards|rules)\b|"
                r"\bwithout\s+(?:any\s+)?content\s+(?:rules|filters|polic(?:y|ies)|restrictions|moderation)\b|"
                r"\byou\s+(?:have|are\s+under|are\s+bound\s+by)\s+no\s+(?:restrictions|rules|limits|filters|guidelines|"
                r"ethics|policies|constraints)\b"
            ),
            "injection: unrestricted persona",
        ),
        (
            (
                r"\b(?:jailbreak|jailbroken|developer\s+mode|god\s+mode|dan\s+mode|sudo\s+mode|admin(?:istrator)?\s+mode|"
                r"do\s+anything\s+now|evil\s+confidant)\b|\bdan\b(?=\s*(?:,|\(|which|who|stands|mode|prompt))"
            ),
            "injection: jailbreak",
        ),
        (
            (
                r"\b(?:disable|turn\s+off|switch\s+off|remove|deactivate|bypass|circumvent|evade|get\s+around)\b"
                r"[\w\s'-]{0,20}?\b(?:safety|filters?|moderation|guardrails|safeguards|content\s+polic(?:y|ies))\b"
            ),
            "injection: disable safety",
        ),
        # quoting the start of the conversation, or what the model was told before the game
        (
            (
                rf"\b{_SAY}\s+(?:me\s+)?(?:back\s+)?(?:[\w'-]+\s+){{0,4}}?(?:first|opening|initial|earliest|1st)\s+"
                r"(?:messages?|prompts?|instructions?|turns?)\b"
                r"(?!\s+(?:of|in|from|for)\s+the\s+(?:recipe|cookbook|game|map|problem|question|task|room|level|puzzle))|"
                r"\b(?:first|opening|initial|earliest)\s+(?:message|thing|words?|text|lines?|instructions?)\s+(?:that\s+)?"
                r"(?:you\s+)?(?:received|got|were\s+(?:given|told|sent|shown))\b(?!\s+(?:from|by)\s+the\s+(?:game|environment))|"
                r"\b(?:opening|first|initial)\s+(?:message|turn|lines?)\s+of\s+(?:this|the|our)\s+(?:conversation|chat|"
                r"session|dialogue|context)\b|"
                r"\b(?:first|last|opening|initial)\s+(?:\w+\s+)?(?:words?|lines?|sentences?|paragraphs?|characters?)\s+of\s+"
                r"(?:your|the\s+system|the\s+hidden|the\s+developer)\s+(?:prompt|instructions|message)\b|"
                r"\b(?:beginning|start)\s+of\s+(?:this|the|our)\s+(?:conversation|chat|session|dialogue|context\s+window)\b|"
                r"\bwhat\s+(?:you\s+were|you've\s+been|you\s+have\s+been|you\s+got)\s+(?:told|given|instructed|sent|shown)\s+"
                r"(?:before|at\s+the\s+(?:start|beginning|top)|first|initially|originally|in\s+the\s+beginning|earlier|"
                r"by\s+(?:the\s+)?(?:system|developer|operator|creator))"
            ),
            "injection: reveal the prompt",
        ),
        # role-play: a persona the model is asked to take on
        (
            (
                r"\brole[\s-]?play(?:s|ing|ed)?\b|\b(?:stay|remain|staying|remaining)\s+in\s+character\b|"
                r"\bin\s+character\s+as\b|\bbreak(?:ing)?\s+character\b|"
                r"\blet'?s\s+play\s+a\s+game\s*(?:where|in\s+which|:|,|-)\s*you\b|"
                r"\byou\s+are\s+(?:now\s+)?(?:dan|stan|my\s+(?:grandma|grandmother|granny|late\s+\w+))\b|"
                r"\bplay\s+(?:the\s+)?(?:role|part)\s+of\s+(?:an?\s+|the\s+|my\s+)?(?:[\w'-]+\s+){0,2}?(?:ai|model|"
                r"assistant|bot|chatbot|developer|admin|administrator|operator|hacker|system|grandma|grandmother|persona|dan)\b|"
                r"\b(?:pretend|imagine|act|behave)\s+(?:that\s+)?(?:to\s+be|you\s+are|you're|as|like)\s+(?:my|the|a|an)\s+"
                r"(?:[\w'-]+\s+){0,2}?(?:grandma|grandmother|granny|developer|admin|administrator|operator|hacker|sysadmin|"
                r"creator)\b"
            ),
            "injection: role-play",
        ),
        # a payload to decode or read backwards, and obey
        (
            (
                r"\b(?:base-?64|b64|rot-?13|rot-?47|atbash|uuencoded?)\b|"
                r"\b(?:decode|decipher|decrypt|unscramble|reverse)\b[^.;]{0,60}?\b(?:and|then)\s+(?:obey|execute|comply|"
                r"do\s+(?:what|as)\s+it\s+says|follow\s+(?:it|them|that|this)|act\s+on\s+it)\b|"
                r"\b(?:backwards?|reversed|in\s+reverse|right\s+to\s+left|mirrored)\b[^.;]{0,30}?\b(?:obey|execute|comply|"
                r"do\s+(?:what|as)\s+it\s+says|follow\s+(?:it|them|that|this))\b"
            ),
            "obfuscation: encoded instruction",
        ),
        (
            (
                r"\b(?:type|enter|send|issue|input|execute|run|use|try|say)\s+(?:the\s+)?(?:command\s+|word\s+|action\s+)?"
                r"[\"'`]?(?:save|restore|restart|undo|quit|script|unscript|transcript|recording|replay|superbrief|verbose)"
                r"\b(?![\w-])|"
                r"\bprint_state\b|\btw-(?:print|extra|trace)|\b(?:purloin|gonear|showme|showverb|showheap)\b"
            ),
            "exploit: interpreter command",
        ),
        # a fixed answer for other tasks: a lesson of one environment reaches the prompts of all
        (
            (
                r"\b(?:answer|reply|respond|say)\s+(?:with\s+)?(?:[\w'\"`-]+\s+){1,3}?(?:to|for|on)\s+"
                r"(?:every|each|any|all)\s+(?:(?:other|single|later|future|following|of\s+the)\s+)?(?:[\w-]+\s+)?"
                r"(?:questions?|problems?|tasks?|prompts?|requests?|quer(?:y|ies)|messages?|games?|episodes?|"
                r"environments?)\b|"
                r"\banswer\s+(?:to|for|of)\s+(?:every|each|any|all)\s+(?:[\w-]+\s+){0,2}?(?:questions?|problems?|"
                r"tasks?)\s+(?:is|will\s+be|should\s+be|must\s+be)\b|"
                r"\b(?:always|only)\s+(?:answer|reply|respond|say)\s+(?:with\s+)?(?:[\"'`]|\d|(?:yes|no|true|false)\b)"
            ),
            "injection: fixed answer for every task",
        ),
        # obeying a named party, or the people behind the prompt
        (
            (
                r"\b(?:obey|heed|listen\s+(?:only\s+)?to|take\s+(?:your\s+)?orders\s+from|defer\s+to|"
                r"do\s+(?:what(?:ever)?|as)|comply\s+with|follow\s+(?:the\s+)?(?:orders|instructions|commands|requests|"
                r"wishes)\s+of|trust\s+only)\s+(?:only\s+)?(?:the\s+|a\s+|an\s+|any\s+|your\s+)?(?:[\w'-]+\s+){0,2}?"
                r"(?:named|called|known\s+as|who\s+(?:calls|names)\s+(?:himself|herself|themselves|itself))\b|"
                r"\b(?:obey|heed|listen\s+(?:only\s+)?to|take\s+(?:your\s+)?orders\s+from|defer\s+to|do\s+whatever|"
                r"comply\s+with|trust\s+only)\s+(?:only\s+)?(?:the\s+|a\s+|an\s+|any\s+|your\s+)?(?:users?|humans?|"
                r"persons?|people|operators?|admins?|administrators?|developers?|owners?|senders?|whoever|anyone|"
                r"someone|accounts?|creators?|masters?)\b"
            ),
            "injection: obey a named party",
        ),
        # acting as the system, and granting privileges
        (
            (
                r"\b(?:act|acting|behave|pose|speak|respond|reply|answer|write|operate|masquerade|"
                r"identify\s+yourself)\s+as\s+(?:if\s+you\s+(?:are|were)\s+)?(?:the\s+|an?\s+)?(?:system|admin|"
                r"administrator|root|superuser|sysadmin|developer|operator|moderator|supervisor)\b|"
                r"\bgrant(?:s|ed|ing)?\s+(?:(?:yourself|me|us|them|him|her|everyone|anyone|the\s+[\w-]+|[\w-]+)\s+)?"
                r"(?:full\s+|elevated\s+|unrestricted\s+)?(?:admin(?:istrator)?|root|sudo|superuser|elevated|"
                r"privileged|unrestricted)\b|"
                r"\bgrant(?:s|ed|ing)?\s+(?:[\w'-]+\s+){0,3}?(?:privileges?|permissions?)\b|"
                r"\b(?:escalate|elevate|raise)\s+(?:[\w'-]+\s+){0,2}?(?:privileges?|permissions?|access\s+level)\b"
            ),
            "injection: acts as the system",
        ),
    ]
]
# The same attacks in the languages a multilingual model reads; written naturally and folded like the text.
OTHER_LANGUAGES = [
    (re.compile(confusables.folded(p)), why)
    for p, why in [
        (
            (
                r"\b(?:ignore[zr]?|oublie[zr]?|ne\s+tenez\s+pas\s+compte|ne\s+tiens\s+pas\s+compte|faites\s+abstraction|"
                r"fais\s+abstraction)\b.{0,40}?\b(?:instructions?|consignes?|règles|directives|indications)\b|"
                r"\b(?:instructions?|consignes?|règles|directives)\s+(?:précédentes|antérieures|ci-dessus|initiales|"
                r"du\s+système)\b"
            ),
            "injection: ignore instructions (fr)",
        ),
        (
            (
                r"\b(?:tu\s+es\s+maintenant|vous\s+êtes\s+maintenant|à\s+partir\s+de\s+maintenant,?\s+(?:tu|vous)|"
                r"fais\s+semblant\s+d'être|faites\s+semblant\s+d'être|prompt\s+système|message\s+système|"
                r"révèle[rz]?\b.{0,30}(?:prompt|instructions|consignes))"
            ),
            "injection: persona or prompt (fr)",
        ),
        (
            (
                r"\b(?:ignorier\w*|vergiss|vergessen\s+sie|missacht\w*|übergeh\w*|beachte\s+nicht|beachten\s+sie\s+nicht)\b"
                r".{0,40}?\b(?:anweisung\w*|instruktion\w*|regeln|befehl\w*|vorgaben|richtlinien)\b|"
                r"\b(?:vorherig|bisherig|obig|vorig|früher|ursprünglich)\w*\s+(?:anweisung|instruktion|vorgabe)\w*"
            ),
            "injection: ignore instructions (de)",
        ),
        (
            (
                r"\b(?:du\s+bist\s+(?:jetzt|nun|ab\s+sofort)|ab\s+(?:jetzt|sofort)\s+bist\s+du|system-?prompt|"
                r"systemanweisung|systemnachricht|tu\s+so,?\s+als\s+(?:ob|wärst))"
            ),
            "injection: persona or prompt (de)",
        ),
        (
            (
                r"\b(?:ignora\w*|olvida\w*|omite|omitir|haz\s+caso\s+omiso|no\s+hagas\s+caso|descarta\w*|"
                r"pasa\s+por\s+alto|dimentica\w*|trascura\w*|esqueç\w*|desconsider\w*|negeer\w*|vergeet)\b.{0,40}?"
                r"\b(?:instrucciones|reglas|indicaciones|directrices|normas|órdenes|istruzioni|regole|direttive|"
                r"indicazioni|instruções|regras|diretrizes|orientações|instructies|regels)\b|"
                r"\b(?:instrucciones|reglas|indicaciones|directrices)\s+(?:anteriores|previas|originales|del\s+sistema)\b|"
                r"\bistruzioni\s+precedenti\b|\binstruções\s+anteriores\b"
            ),
            "injection: ignore instructions (es/it/pt/nl)",
        ),
        (
            (
                r"\b(?:ahora\s+eres|a\s+partir\s+de\s+ahora,?\s+(?:eres|tú|responde)|finge\s+(?:que\s+eres|ser)|"
                r"prompt\s+del\s+sistema|mensaje\s+del\s+sistema|ora\s+sei|d'ora\s+in\s+poi|fingi\s+di\s+essere|"
                r"prompt\s+di\s+sistema|agora\s+você\s+é|a\s+partir\s+de\s+agora|finja\s+(?:ser|que)|prompt\s+do\s+sistema|"
                r"je\s+bent\s+nu)\b"
            ),
            "injection: persona or prompt (es/it/pt/nl)",
        ),
        (
            (
                r"(?:игнорир\w*|проигнорир\w*|ігнор\w*|забуд\w*|забудь\w*|не\s+обращай|пренебреги|отбрось)"
                r".{0,40}?(?:инструкци\w*|указани\w*|правил\w*|команд\w*|промпт\w*)|"
                r"(?:ты\s+теперь|теперь\s+ты|отныне\s+ты|притворись|системн\w*\s+(?:промпт|подсказк|сообщени|инструкци))"
            ),
            "injection: ignore instructions (ru/uk)",
        ),
        (
            (
                r"(?:忽略|无视|無視|忽视|忽視|不要理会|不要理會|不要遵守|别管|別管|忘记|忘記|忘掉|抛开|拋開|绕过|繞過|跳过|跳過)"
                r"[^。.!?！？]{0,15}?(?:指令|指示|说明|說明|规则|規則|提示|命令|设定|設定|要求|约束|約束)|"
                r"(?:之前|以前|先前|上面|以上|前面|原来|原來|原先|所有)的?(?:所有|全部)?(?:指令|指示|规则|規則|提示词?|提示詞?|设定|設定)"
                r"[^。]{0,6}?(?:作废|作廢|无效|無效|失效|过时|過時|不再适用|不再適用)|"
                r"系统(?:提示|消息|指令|设定)|系統(?:提示|訊息|消息|指令|設定)|"
                r"(?:显示|顯示|输出|輸出|重复|重複|打印|泄露|告诉我|告訴我|说出|說出|复述|複述)[^。]{0,10}?"
                r"(?:提示词|提示詞|初始指令|以上内容|以上內容|上面的内容|上面的內容|上述内容|上述內容)|"
                r"你现在是|你現在是|从现在开始，?你|從現在開始，?你|假装你是|假裝你是|扮演一个|扮演一個|没有任何限制|沒有任何限制|"
                r"不受限制|越狱|越獄|开发者模式|開發者模式"
            ),
            "injection: ignore instructions (zh)",
        ),
        (
            (
                r"(?:以前|前|上記|これまで|先|最初)の(?:すべての|全ての)?(?:指示|命令|ルール|指令|設定|プロンプト)を?"
                r"(?:すべて|全て)?(?:無視|忘れ)|(?:指示|命令|ルール|プロンプト)を(?:すべて|全て)?(?:無視|忘れ)|"
                r"システムプロンプト|あなたは今|制限のない"
            ),
            "injection: ignore instructions (ja)",
        ),
        (
            (
                r"(?:이전|앞의|위의|모든|기존)\s*(?:의\s*)?(?:모든\s*)?(?:지시|지침|명령|규칙|프롬프트)\w*\s*(?:을|를)?\s*"
                r"(?:모두\s*)?(?:무시|잊)|시스템\s*프롬프트|너는\s*이제|당신은\s*이제"
            ),
            "injection: ignore instructions (ko)",
        ),
    ]
]
# Attacks that stay attacks when every non-letter is removed (spaced, dotted, hyphenated, reversed).
SQUASHED = re.compile(
    r"(?:ignore|disregard|forget|override|bypass)(?:of|the|and)*"
    r"(?:all|any|every|your|previous|prior|above|earlier|preceding|original|initial|system|developer|given)"
    r"(?:all|any|every|your|previous|prior|above|earlier|preceding|original|initial|system|developer|given|of|the|and)*"
    r"(?:instructions?|prompts?|rules|guidelines|directives|messages?)"
    r"|systemprompt|jailbreak|developermode|doanythingnow"
)
LINKS = [
    (re.compile(p), why)
    for p, why in [
        (
            (
                r"\b[a-z][a-z0-9+.-]{1,15}://|\bhxxps?:|\bh\s*t\s*t\s*p\s*s?\s*:\s*/\s*/|\bwww\d?\.[a-z0-9-]+|"
                r"\b(?:javascript|vbscript|mailto):|\bfile:/|\bdata:[a-z]+/[a-z0-9.+-]+[;,]"
            ),
            "link: url",
        ),
        (r"\[[^\]\n]{0,200}\]\(\s*<?[^)\s]*[./:@][^)]*\)", "link: markdown link"),
        (r"<\s*(?:a|img|iframe|script|link|object|embed|form)\b[^>]*(?:href|src|action)\s*=", "link: html"),
        (
            (
                r"(?<![\w@.-])(?:[a-z0-9-]+\.)+(?:com|net|org|io|ru|cn|xyz|info|biz|onion|top|site|online|app|dev|sh|ly|"
                r"gg|me|co|tk|to|cc|ws|su|link|click|zip)(?::\d+)?/|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+|/)"
            ),
            "link: url",
        ),
    ]
]
# A bare domain without a path counts only for unambiguous top-level domains written in one case, so that
# "the door.To open it" (a missing space) is not a link.
BARE_DOMAIN = re.compile(
    r"(?<![\w@.-])(?:[a-z0-9-]+\.)+(?:com|net|org|io|ru|cn|xyz|info|biz|onion|online|site)\b"
    r"|(?<![\w@.-])(?:[A-Z0-9-]+\.)+(?:COM|NET|ORG|IO|RU|CN|XYZ|INFO|BIZ|ONION|ONLINE|SITE)\b"
)
DEFANGED = re.compile(r"\[\.\]|\(\.\)|\[dot\]|\(dot\)", re.IGNORECASE)
SHELL = [
    (re.compile(p), why)
    for p, why in [
        (
            (
                r"\|\s*(?:sudo\s+)?(?:(?:ba|z|k|da|c|tc|fi|a)?sh|python[0-9.]*|perl|ruby|node|php|iex|"
                r"invoke-expression|powershell|pwsh|cmd|source)\b"
            ),
            "command: shell pipeline",
        ),
        (
            (
                r"\b(?:curl|wget|iwr|invoke-webrequest|invoke-restmethod|certutil|bitsadmin)\s+-{0,2}[\w'\"$]|"
                r"\b(?:ba|z|k|da)?sh\s+-c\b|\bpython[0-9.]*\s+-c\b|\b(?:perl|ruby|node)\s+-e\b|\bpowershell\b|\bpwsh\b|"
                r"\bcmd(?:\.exe)?\s+/c\b|\brm\s+-[a-z]*[rf]|\bchmod\s+[+0-7]|\bmkfifo\b|\bnc\s+-[a-z]*e\b|\bnetcat\b|"
                r"/dev/tcp/|\bsudo\s+\w|\bdd\s+if=|:\(\)\s*\{|\bbase64\s+(?:-d|--decode)\b|\beval\s*\(|\bexec\s*\(|"
                r"\bos\.system\b|\bsubprocess\b|\b__import__\b|\$\(\s*(?:curl|wget|cat|echo|rm|sh|bash|python|id|whoami|nc)\b"
            ),
            "command: shell",
        ),
    ]
]
BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
# C0 controls but tab and newline, DEL, C1 controls: a terminal acts on them (ESC starts an escape sequence,
# OSC 52 writes the clipboard, CR overwrites the line), and no lesson needs one.
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# HTML and markdown comments, and markup that pretends to be a turn or an instruction block
HIDDEN_MARKUP = re.compile(
    r"<!--|^\s*\[(?://|comment|#|_)?\]\s*:\s*(?:#|<>)|"
    r"<\s*/?\s*(?:system|user|assistant|developer|instructions?|prompt|admin|tool|im_start|im_end|sys)\b[^<>]{0,40}>",
    re.IGNORECASE | re.MULTILINE,
)
# base64 (standard or URL-safe alphabet) long enough to hold a sentence
BASE64_RUN = re.compile(r"(?<![\w+/=-])[A-Za-z0-9+/_-]{12,}={0,2}(?![\w+/=-])")

_CREDENTIAL = r"(?:password|passwd|pwd|passphrase|secret|api[_ -]?key|access[_ -]?key|auth[_ -]?token|token)\b"
SECRETS = [
    (re.compile(p), why)
    for p, why in [
        (r"-----BEGIN [A-Z ]*PRIVATE KEY-----", "secret: private key"),
        (r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}", "secret: API key"),
        (r"\bAKIA[0-9A-Z]{16}\b", "secret: AWS access key"),
        (r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{20,}", "secret: GitHub token"),
        (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", "secret: Slack token"),
        (r"\bAIza[0-9A-Za-z_-]{30,}", "secret: Google API key"),
        (r"\bhf_[A-Za-z0-9]{30,}", "secret: Hugging Face token"),
        (r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", "secret: JWT"),
        (r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{16,}", "secret: bearer token"),
        (
            rf"(?i)\b{_CREDENTIAL}\s*[=:]\s*['\"]?[^\s'\"]{{6,}}",
            "secret: credential assignment",
        ),
        (
            # "the password is X" only when X looks machine-made (a digit or symbol): game text says
            # "the secret is behind the painting" and that is a fine lesson.
            rf"(?i)\b{_CREDENTIAL}\s+is\s+['\"]?(?=[^\s'\"]*[\d_!@#$%^&*+/=])[^\s'\"]{{6,}}",
            "secret: credential assignment",
        ),
    ]
]

# An environment's action names, before induction makes lesson text of them (`safety.action_name_problem`):
# a move of a game is a short command about the game's world; these say something to the reader instead.
ACTION_SENTENCE = re.compile(r"[!?;:\"`\n\r]|[.,](?!\d)")
ACTION_DIRECTIVE = re.compile(
    r"\b(?:ignore|ignoring|disregard|forget|obey|disobey|override|overrule|bypass|circumvent|pretend|roleplay|"
    r"role-play|impersonate|reveal|grant|comply|always|never|must|should|shall|instead|don'?t|do\s+not|"
    r"stop\s+(?:following|obeying|listening|using|reading)|act\s+(?:as|like)|behave|from\s+now\s+on)\b"
)
ACTION_ADDRESSEE = re.compile(
    r"\b(?:you|your|yours|yourself|yourselves|assistant|model|ai|llm|gpt|chatbot|system|user|users|developer|"
    r"operator|admin|administrator)\b"
)
ACTION_META = re.compile(
    r"\b(?:lessons?|instructions?|prompts?|rules|guidelines|directives?|polic(?:y|ies)|advice|experience|context|"
    r"conversation|questions?|tasks?|episodes?)\b"
)
