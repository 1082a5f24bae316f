package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestHistoryPages: GET /v1/sandboxes/{id}/history pages in event order
// with limit and after, answers next only while there is more, and the
// pages together are the unpaged history; bad limits and afters are 400s
// naming the value (the client's HistoryPage walks the same pages).
func TestHistoryPages(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	for range 3 {
		for _, op := range []string{"pause", "wake"} {
			if code := h.API("POST", "/v1/sandboxes/"+rec.ID+"/"+op, nil, nil); code != 200 {
				t.Fatalf("%s: %d", op, code)
			}
		}
	}
	var all client.History
	if code := h.API("GET", "/v1/sandboxes/"+rec.ID+"/history", nil, &all); code != 200 || len(all.Events) != 8 || all.Next != 0 {
		t.Fatalf("unpaged history: %d, %d events, next %d; want 200, 8 events (creating, running, 3 × paused, running), no next", code, len(all.Events), all.Next)
	}
	var got []uint64
	after := uint64(0)
	for n := 0; ; n++ {
		var page client.History // fresh: a last page has no next to keep
		path := "/v1/sandboxes/" + rec.ID + "/history?limit=3"
		if n > 0 {
			path += "&after=" + strconv.FormatUint(after, 10)
		}
		if code := h.API("GET", path, nil, &page); code != 200 {
			t.Fatalf("GET %s: %d", path, code)
		}
		for _, ev := range page.Events {
			got = append(got, ev.ID)
		}
		if page.Next == 0 {
			if len(page.Events) != 2 {
				t.Fatalf("last page: %d events, want 2", len(page.Events))
			}
			break
		}
		if len(page.Events) != 3 || page.Next != page.Events[2].ID {
			t.Fatalf("page %d: %d events, next %d", n, len(page.Events), page.Next)
		}
		after = page.Next
	}
	var want []uint64
	for _, ev := range all.Events {
		want = append(want, ev.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages gave %v, want %v", got, want)
	}

	// after alone: a page of the default size; after the last event: an
	// empty page (the sandbox has a history), not a 404.
	var rest client.History
	if code := h.API("GET", fmt.Sprintf("/v1/sandboxes/%s/history?after=%d", rec.ID, want[1]), nil, &rest); code != 200 || len(rest.Events) != 6 || rest.Next != 0 || rest.Events[0].ID != want[2] {
		t.Fatalf("after=%d: %d %+v, want the 6 later events and no next", want[1], code, rest)
	}
	var empty map[string]any
	if code := h.API("GET", fmt.Sprintf("/v1/sandboxes/%s/history?after=%d", rec.ID, want[7]), nil, &empty); code != 200 || fmt.Sprint(empty["events"]) != "[]" || empty["next"] != nil {
		t.Fatalf("after the last event: %d %v, want 200 with no events and no next", code, empty)
	}

	// The client walks the same pages.
	c, err := client.New(h.APIURL(""), gatewaytest.Token, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.HistoryPage(context.Background(), rec.ID, client.HistoryOptions{Limit: 5})
	if err != nil || len(p.Events) != 5 || p.Next != want[4] {
		t.Fatalf("client page 1: %v %d events next %d", err, len(p.Events), p.Next)
	}
	if p, err = c.HistoryPage(context.Background(), rec.ID, client.HistoryOptions{Limit: 5, After: p.Next}); err != nil || len(p.Events) != 3 || p.Next != 0 {
		t.Fatalf("client page 2: %v %d events next %d", err, len(p.Events), p.Next)
	}

	for _, tc := range []struct{ query, want string }{
		{"limit=0", `limit "0" is not a whole number from 1 to 1000`},
		{"limit=1001", `limit "1001" is not a whole number from 1 to 1000`},
		{"limit=x", `limit "x" is not a whole number from 1 to 1000`},
		{"limit=2&after=-1", `after "-1" is not an event id (the next of an earlier page)`},
		{"after=abc", `after "abc" is not an event id (the next of an earlier page)`},
		{"after=18446744073709551616", `after "18446744073709551616" is not an event id`},
	} {
		var e client.ErrorResponse
		if code := h.API("GET", "/v1/sandboxes/"+rec.ID+"/history?"+tc.query, nil, &e); code != http.StatusBadRequest || e.Error.Code != "invalid" || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("?%s: %d %+v, want 400 invalid saying %s", tc.query, code, e.Error, tc.want)
		}
	}
	var e client.ErrorResponse
	if code := h.API("GET", "/v1/sandboxes/"+testenv.UniqueID("nx")+"/history?limit=2", nil, &e); code != http.StatusNotFound {
		t.Errorf("paged history of an unknown sandbox: %d %+v, want 404", code, e.Error)
	}
}

// Bounds of a denial flood, as docs/api.md states them: per sandbox and
// minute, at most egress.DeniedPerWindow sandbox.egress_denied events and
// one summary. The flood below may straddle two windows.
const (
	floodFor            = 60 * time.Second
	floodRate           = 1000 // destinations a second
	floodWindows        = 2
	floodMaxHistory     = 64 << 10 // bytes of the flooding sandbox's history
	floodMaxHeapGrowth  = 32 << 20
	floodMaxRSSGrowth   = 64 << 20
	floodMaxStoreGrowth = 4 << 20
)

// TestEgressDenialFloodIsBounded: a sandbox under none sends UDP to 60,000
// distinct destinations over a minute (TEST-NET-2 addresses, dropped by
// its firewall in the kernel: nothing leaves). The denial counter rises by
// thousands, but its events, webhook deliveries and history stay within
// the limiter's bounds, the gateway's heap and store barely grow, and
// another sandbox's event comes through the event stream while the flood
// runs.
func TestEgressDenialFloodIsBounded(t *testing.T) {
	rc := newReceiver(t, "whsec-flood", 0)
	h := newHarness(t, webhookOption(rc.srv.URL, "whsec-flood"))
	create := func(policy string) client.Sandbox {
		id := testenv.UniqueID("fl")
		h.RemoveOnCleanup(id)
		var rec client.Sandbox
		if code := h.API("POST", "/v1/sandboxes", map[string]any{"id": id, "image": h.Image, "ports": []int{8080}, "egress": map[string]any{"policy": policy}}, &rec); code != http.StatusCreated {
			t.Fatalf("create: %d %+v", code, rec)
		}
		return rec
	}
	flooder, other := create("none"), create("none")
	stream := h.events(t, "?sandbox="+other.ID, "")

	heap0, rss0, store0 := heapBytes(), rssBytes(t), storeBytes(t, h.Dir)
	var before client.Sandbox
	h.API("GET", "/v1/sandboxes/"+flooder.ID, nil, &before)
	floodPath := fmt.Sprintf("/flood?net=198.51.100.0/24&port=20000&rate=%d&for=%s", floodRate, floodFor)
	if resp, body := h.Preview("GET", h.Host(flooder.ID, 8080), floodPath, nil, nil); resp.StatusCode != 200 {
		t.Fatalf("starting the flood: %d %s", resp.StatusCode, body)
	}
	status := func() string {
		_, body := h.Preview("GET", h.Host(flooder.ID, 8080), "/flood?status=1", nil, nil)
		return strings.TrimSpace(body)
	}

	// A third of the way in, another sandbox stops: its event must come
	// through while the flood still runs.
	third := int(floodRate * floodFor.Seconds() / 3)
	testenv.Eventually(t, floodFor, func() (bool, string) {
		s := status()
		var state string
		var sent, errs int
		fmt.Sscanf(s, "%s sent %d errors %d", &state, &sent, &errs)
		return sent >= third, fmt.Sprintf("the flood a third of the way in (%d datagrams): %s", third, s)
	})
	asked := time.Now()
	if code := h.API("POST", "/v1/sandboxes/"+other.ID+"/stop", nil, nil); code != 200 {
		t.Fatalf("stopping the other sandbox: %d", code)
	}
	for {
		ev := stream.next(t, 10*time.Second)
		if ev.Type == "sandbox.stopped" {
			break
		}
	}
	latency := time.Since(asked)
	if s := status(); !strings.HasPrefix(s, "running") {
		t.Fatalf("the other sandbox's event came after the flood ended (%s)", s)
	}
	t.Logf("the other sandbox's stop reached the event stream %s after it was asked for, during the flood", latency.Round(time.Millisecond))

	testenv.Eventually(t, floodFor+30*time.Second, func() (bool, string) {
		s := status()
		return strings.HasPrefix(s, "done"), s
	})
	t.Logf("flood: %s", status())
	var after client.Sandbox
	h.API("GET", "/v1/sandboxes/"+flooder.ID, nil, &after)
	// The counters are read at most every few seconds.
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		h.API("GET", "/v1/sandboxes/"+flooder.ID, nil, &after)
		return after.EgressDenied >= before.EgressDenied+10000, fmt.Sprintf("egress_denied %d → %d", before.EgressDenied, after.EgressDenied)
	})

	// Once the last window has ended and been swept, its summary is
	// delivered, and every event of the flood has reached the receiver.
	count := func(evs []lifecycle.Event) (denied, summaries int, suppressed uint64) {
		for _, ev := range evs {
			switch ev.Type {
			case lifecycle.EventEgressDenied:
				denied++
			case lifecycle.EventEgressDeniedSummary:
				summaries++
				if ev.Denials != nil {
					suppressed += ev.Denials.Suppressed
				}
			}
		}
		return
	}
	var hist []lifecycle.Event
	var histBytes int
	history := func() error {
		req, _ := http.NewRequest("GET", h.APIURL("/v1/sandboxes/"+flooder.ID+"/history"), nil)
		req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var page struct{ Events []lifecycle.Event }
		if err := json.Unmarshal(b, &page); err != nil {
			return err
		}
		hist, histBytes = page.Events, len(b)
		return nil
	}
	if err := history(); err != nil {
		t.Fatal(err)
	}
	if denied, _, _ := count(hist); denied > floodWindows*egress.DeniedPerWindow {
		t.Fatalf("the flood logged %d egress_denied events (history of %d bytes), want at most %d", denied, histBytes, floodWindows*egress.DeniedPerWindow)
	}
	testenv.Eventually(t, 2*egress.DeniedWindow, func() (bool, string) {
		if err := history(); err != nil {
			return false, err.Error()
		}
		denied, summaries, _ := count(hist)
		delivered := 0
		for _, d := range rc.forSandbox(flooder.ID) {
			if strings.HasPrefix(d.event.Type, "sandbox.egress_denied") {
				delivered++
			}
		}
		return summaries >= 1 && delivered == denied+summaries, fmt.Sprintf("%d denied, %d summaries, %d delivered", denied, summaries, delivered)
	})
	denied, summaries, suppressed := count(hist)
	deliveries := rc.forSandbox(flooder.ID)
	heap1, rss1, store1 := heapBytes(), rssBytes(t), storeBytes(t, h.Dir)
	t.Logf("flood of %d destinations: egress_denied counter %d → %d; %d egress_denied events and %d summaries (%d suppressed) logged; %d webhook deliveries; history %d bytes; heap %d → %d KiB; RSS %d → %d KiB; store %d → %d KiB",
		int(floodFor.Seconds())*floodRate, before.EgressDenied, after.EgressDenied, denied, summaries, suppressed, len(deliveries), histBytes, heap0>>10, heap1>>10, rss0>>10, rss1>>10, store0>>10, store1>>10)

	if denied > floodWindows*egress.DeniedPerWindow || summaries < 1 || summaries > floodWindows {
		t.Errorf("%d egress_denied events and %d summaries, want at most %d and between 1 and %d", denied, summaries, floodWindows*egress.DeniedPerWindow, floodWindows)
	}
	if suppressed < 10000 {
		t.Errorf("the summaries count %d suppressed denials, want the flood's thousands", suppressed)
	}
	if n := len(deliveries); n > floodWindows*(egress.DeniedPerWindow+1)+4 { // + created, running
		t.Errorf("%d webhook deliveries of the flooding sandbox, want at most %d", n, floodWindows*(egress.DeniedPerWindow+1)+4)
	}
	if histBytes > floodMaxHistory {
		t.Errorf("history of %d bytes, want at most %d", histBytes, floodMaxHistory)
	}
	if g := heap1 - heap0; g > floodMaxHeapGrowth {
		t.Errorf("heap grew %d KiB, want at most %d", g>>10, floodMaxHeapGrowth>>10)
	}
	if g := rss1 - rss0; g > floodMaxRSSGrowth {
		t.Errorf("RSS grew %d KiB, want at most %d", g>>10, floodMaxRSSGrowth>>10)
	}
	if g := store1 - store0; g > floodMaxStoreGrowth {
		t.Errorf("store grew %d KiB, want at most %d", g>>10, floodMaxStoreGrowth>>10)
	}
}

// heapBytes is the live heap after a collection.
func heapBytes() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// rssBytes is this process's resident set (the gateway runs in it).
func rssBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// storeBytes is the disk the store's files take (blocks written: Badger
// preallocates its files sparsely).
func storeBytes(t *testing.T, dir string) int64 {
	var n int64
	err := filepath.WalkDir(filepath.Join(dir, "sandwake"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
