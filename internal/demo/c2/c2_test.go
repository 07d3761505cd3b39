package c2

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandlerLogsEachCheckIn(t *testing.T) {
	var log bytes.Buffer
	srv := httptest.NewServer(NewHandler(&log))
	defer srv.Close()
	for i, body := range []string{`{"id":"bot-1","seq":1,"attempt":1}`, `not json`} {
		req, _ := http.NewRequest("POST", srv.URL+"/gate", strings.NewReader(body))
		req.Host = "c2.example"
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Server") != ServerName {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, resp.Header.Get("Server"))
		}
	}
	hits, err := ReadHits(&log)
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) != 2 || hits[0].Bot != "bot-1" || hits[0].Seq != 1 || hits[0].Host != "c2.example" || hits[0].Path != "/gate" || hits[0].Remote != "127.0.0.1" || hits[1].Bot != "" {
		t.Fatalf("hits = %+v", hits)
	}
}

// The beacon's report of its task is answered, not logged as a check-in.
func TestHandlerAnswersAReportWithoutLoggingIt(t *testing.T) {
	var log bytes.Buffer
	srv := httptest.NewServer(NewHandler(&log))
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/gate", "application/json", strings.NewReader(`{"id":"bot-1","seq":1,"attempt":1,"done":"sleep"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || log.Len() != 0 {
		t.Fatalf("%d, logged %q", resp.StatusCode, log.String())
	}
}
