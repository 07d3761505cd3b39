# Sourced by nostore.sh and shapes.sh (from the repository root, with $out
# set): generates the capture shapes that are missing in $out and sets
# bulk, mixed, scan and day_files (the 24 hourly files of a day).
bulk=$out/tb-parse-mixed-50000000.pcap
mixed=$out/tb-parse-mixed-20000000-x0.1.pcap
[ -s "$bulk" ] || go run ./bench/tb-parse/gen -size 50000000 -o "$bulk"
[ -s "$mixed" ] || go run ./bench/tb-parse/gen -size 20000000 -scale 0.1 -o "$mixed"
[ -s "$out/day-2000000/day.json" ] || go run ./bench/tb-parse/day -o "$out/day-2000000" -conns 2000000
[ -s "$out/day-20000/day.json" ] || go run ./bench/tb-parse/day -o "$out/day-20000" -conns 20000
scan=$out/day-2000000/hour-00.pcap
day_files=("$out"/day-20000/hour-*.pcap)
