package preview_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/preview"
)

// unfurlers are User-Agents the apps people paste preview links in send.
var unfurlers = []string{
	"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
	"Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
	"Twitterbot/1.0",
	"LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://www.linkedin.com)",
	"WhatsApp/2.23.20.0 A",
	"TelegramBot (like TwitterBot)",
	"Mozilla/5.0 (Windows NT 6.1; WOW64) SkypeUriPreview Preview/0.5 skype-url-preview@microsoft.com",
	"facebookexternalhit/1.1 Facebot Twitterbot/1.0", // iMessage
}

// TestUnfurlsWithoutAWake: after a page load in a browser, unfurl bots
// asking the sleeping sandbox get a card of the app's last page's tags
// (escaped) and its og:image, each counted as an unfurl, and the sandbox is
// not started; a sandbox made private gives no card until its owner sets
// public_card.
func TestUnfurlsWithoutAWake(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)
	images := preview.CardImagesKept()
	ctx := gatewaytest.NewBrowser(t)
	gatewaytest.Browse(t, ctx, "loading the app's page", chromedp.Navigate("http://"+host+"/card"), chromedp.WaitVisible(chromedp.CSS("h1")))
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return preview.CardImagesKept() > images, "the page's og:image was not kept"
	})
	h.Stop(rec.ID)
	since := time.Now()
	unfurls := func() float64 {
		return testutil.ToFloat64(preview.MetricRequests.WithLabelValues(preview.OutcomeUnfurl))
	}
	unfurled := unfurls()
	for _, ua := range unfurlers {
		resp, body := h.Preview("GET", host, "/card", nil, http.Header{"User-Agent": {ua}})
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %.200q", ua, resp.StatusCode, body)
		}
		for _, want := range []string{
			`<title>Tom &amp; Jerry&#39;s &#34;&lt;preview&gt;&#34;</title>`,
			`<meta name="description" content="A card with &lt;tags&gt; &amp; &#34;quotes&#34;">`,
			`<meta property="og:title" content="Tom &amp; Jerry &lt;3">`,
			`<meta property="og:image" content="/og.png">`,
			`<meta name="twitter:card" content="summary_large_image">`,
			`<meta name="sandwake-state" content="stopped">`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("%s: the card lacks %s:\n%s", ua, want, body)
			}
		}
		if strings.Contains(body, "<preview>") {
			t.Errorf("%s: a tag came out unescaped:\n%s", ua, body)
		}
	}
	resp, img := h.Preview("GET", host, "/og.png", nil, http.Header{"User-Agent": {unfurlers[0]}})
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/png" || !bytes.HasPrefix([]byte(img), []byte("\x89PNG")) {
		t.Errorf("og:image to a bot: %d %s %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), len(img))
	}
	if got := unfurls() - unfurled; got < float64(len(unfurlers)+1) {
		t.Errorf("%d cards and og:images served, %v counted as unfurls", len(unfurlers)+1, got)
	}
	// Made private: no card, the asleep page, and no unfurl counted.
	var v client.Sandbox
	if status := h.API("PATCH", "/v1/sandboxes/"+rec.ID, map[string]any{"access": "private"}, &v); status != http.StatusOK {
		t.Fatalf("PATCH access private: %d", status)
	}
	unfurled = unfurls()
	resp, body := h.Preview("GET", host, "/card", nil, http.Header{"User-Agent": {unfurlers[0]}})
	if resp.StatusCode == 200 || strings.Contains(body, "Tom &amp; Jerry") {
		t.Errorf("a private sandbox gave its card: %d %.200q", resp.StatusCode, body)
	}
	if resp, _ := h.Preview("GET", host, "/og.png", nil, http.Header{"User-Agent": {unfurlers[0]}}); resp.StatusCode == 200 {
		t.Errorf("a private sandbox gave its og:image: %d", resp.StatusCode)
	}
	if got := unfurls() - unfurled; got != 0 {
		t.Errorf("a private sandbox's refusals counted %v unfurls", got)
	}
	// Its owner turns the card on: bots get it again, still without a wake.
	if status := h.API("PATCH", "/v1/sandboxes/"+rec.ID, map[string]any{"public_card": true}, &v); status != http.StatusOK || !v.PublicCard || v.Access != "private" {
		t.Fatalf("PATCH public_card true: %d, public_card %v, access %s", status, v.PublicCard, v.Access)
	}
	resp, body = h.Preview("GET", host, "/card", nil, http.Header{"User-Agent": {unfurlers[1]}})
	if resp.StatusCode != 200 || !strings.Contains(body, `<meta property="og:title" content="Tom &amp; Jerry &lt;3">`) {
		t.Errorf("a private sandbox with public_card gave no card: %d %.200q", resp.StatusCode, body)
	}
	// Without a token the app itself stays closed to a browser.
	if resp, body := h.Preview("GET", host, "/card", nil, http.Header{"User-Agent": {"Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0"}}); resp.StatusCode == 200 && strings.Contains(body, "Tom &amp; Jerry") {
		t.Errorf("public_card opened the private sandbox to a browser without a token: %d %.200q", resp.StatusCode, body)
	}
	if n := h.StartEvents(rec.ID, since); n != 0 {
		t.Errorf("unfurls started the sandbox %d times", n)
	}
	if s := h.State(rec.ID); s != "stopped" {
		t.Errorf("after the unfurls the sandbox is %s", s)
	}
}

// TestPublicCardOfAPrivateSandbox: a sandbox private from its create, with
// public_card: a page load with a token is read for its card; unfurl bots
// without a token get the card while it runs and while it sleeps (no
// wake); a browser without a token gets 401, and a bot with a token the app.
func TestPublicCardOfAPrivateSandbox(t *testing.T) {
	h := newHarness(t, "")
	id := testenv.UniqueID("pc")
	h.RemoveOnCleanup(id)
	var rec client.Sandbox
	if status := h.API("POST", "/v1/sandboxes", map[string]any{"id": id, "image": h.Image, "ports": []int{8080}, "access": "private", "public_card": true}, &rec); status != http.StatusCreated || !rec.PublicCard {
		t.Fatalf("create private with public_card: %d %+v", status, rec)
	}
	var tok client.Token
	if status := h.API("POST", "/v1/sandboxes/"+id+"/tokens", nil, &tok); status != http.StatusCreated {
		t.Fatalf("token: %d", status)
	}
	host := h.Host(id, 8080)
	bot := http.Header{"User-Agent": {unfurlers[0]}}
	const title = `<meta property="og:title" content="Tom &amp; Jerry &lt;3">`
	if resp, body := h.Preview("GET", host, "/card", nil, bot); resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, title) {
		t.Fatalf("a bot before any page load: %d %.200q, want 401 (no card yet)", resp.StatusCode, body)
	}
	ctx := gatewaytest.NewBrowser(t)
	gatewaytest.Browse(t, ctx, "loading the private app's page with a token",
		chromedp.Navigate("http://"+host+"/card?sandwake_token="+tok.Token), chromedp.WaitVisible(chromedp.CSS("h1")))
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		resp, body := h.Preview("GET", host, "/card", nil, bot)
		return resp.StatusCode == 200 && strings.Contains(body, title) && strings.Contains(body, `content="running"`),
			fmt.Sprintf("a bot on the running sandbox: %d %.200q", resp.StatusCode, body)
	})
	if resp, _ := h.Preview("GET", host, "/card", nil, http.Header{"User-Agent": {"Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0"}}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a browser without a token: %d, want 401", resp.StatusCode)
	}
	withToken := http.Header{"User-Agent": {unfurlers[0]}, "Authorization": {"Bearer " + tok.Token}}
	if resp, body := h.Preview("GET", host, "/card", nil, withToken); resp.StatusCode != 200 || strings.Contains(body, "sandwake-state") || !strings.Contains(body, "<h1>card</h1>") {
		t.Errorf("a bot with a token: %d %.200q, want the app's page", resp.StatusCode, body)
	}
	h.Stop(id)
	since := time.Now()
	if resp, body := h.Preview("GET", host, "/card", nil, bot); resp.StatusCode != 200 || !strings.Contains(body, title) || !strings.Contains(body, `content="stopped"`) {
		t.Errorf("a bot on the stopped sandbox: %d %.200q", resp.StatusCode, body)
	}
	if n := h.StartEvents(id, since); n != 0 {
		t.Errorf("the bot started the sandbox %d times", n)
	}
}
