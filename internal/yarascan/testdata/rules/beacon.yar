// Rules written for Talkbox's benign test beacon: its strings, never a
// real family's.
rule TalkboxBeacon : talkbox demo {
  meta:
    description = "the Talkbox test beacon (benign)"
    author = "Talkbox"
    score = 50
    benign = true
  strings:
    $ua = "talkbox-beacon"
    $hello = "TBHELLO"
  condition:
    any of them
}
