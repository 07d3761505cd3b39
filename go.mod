module github.com/talkbox-sandbox/talkbox

go 1.26.8

require (
	github.com/alecthomas/kong v1.17.0 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.7 // indirect
	github.com/rogpeppe/go-internal v1.16.0 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/tools v0.26.0 // indirect
)

tool github.com/cpuguy83/go-md2man/v2
