package capture

// DialControl connects to a capture's control socket, for tests that speak
// the protocol by hand (a client that dribbles or floods).
var DialControl = dialControl
