rule TalkboxDrop {
  meta:
    description = "the file the beacon drops: \"does nothing\""
  strings:
    $s = "dropped by the Talkbox test beacon"
  condition:
    $s
}
