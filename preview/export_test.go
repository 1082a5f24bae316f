package preview

// Names of the preview path that its external tests (package preview_test)
// read.
const (
	PageAsleep       = pageAsleep
	PageError        = pageError
	PageUnauthorized = pageUnauthorized
	PageWarming      = pageWarming
	PathEvents       = pathEvents
	PathStatus       = pathStatus
	PathWake         = pathWake
	OutcomeNotFound  = outcomeNotFound
	OutcomeUnfurl    = outcomeUnfurl
	SpanWake         = spanWake
	WakeReady        = wakeReady
	WakeWarmingPage  = wakeWarmingPage
)

var (
	AttrOutcome            = attrOutcome
	MetricRequests         = metricRequests
	MetricWaitersCollapsed = metricWaitersCollapsed
	RequestsProxied        = requestsProxied
	ReasonSentence         = reasonSentence
)

// CardImagesKept counts the og:images the gate kept.
func CardImagesKept() int64 { return cardImagesKept.Load() }
