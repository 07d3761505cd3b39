// YARA rules for Talkbox's own benign test beacons (internal/demo/beacon,
// internal/demo/cbeacon): what `make demo` and the end-to-end tests run
// over the beacon, its dropped file and the guest's memory. They match the
// beacons' own strings, never a real family's.

rule TalkboxBeacon : talkbox test_beacon {
  meta:
    description = "Talkbox's benign test beacon: its HTTP User-Agent"
    author = "Talkbox"
  strings:
    $ua = "User-Agent: tb-beacon/1"
  condition:
    $ua
}

rule TalkboxBeaconDrop : talkbox test_beacon {
  meta:
    description = "the file the beacon's -behave mode drops"
    author = "Talkbox"
  strings:
    $s = "dropped by the Talkbox test beacon"
  condition:
    $s at 10 or ($s and filesize < 4KB)
}
