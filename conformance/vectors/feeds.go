package vectors

import (
	"fmt"

	"agentmesh.dev/mesh/shared/feeds"
	"agentmesh.dev/mesh/shared/protocol"
)

// checkFeeds: the feed subject grammar (build and parse), the emit payload
// {topic, kind, data} and its kinds, the state KV key and the current-value
// lookup, through shared/protocol and shared/feeds.
func checkFeeds(t *T, doc map[string]any) {
	if s, ok := doc["subjects"].(map[string]any); ok {
		if ls := optStr(s, "lookup_subject"); ls != "" {
			t.Run("subjects/lookup_subject", func() error {
				if ls != protocol.SubjFeedGet {
					return fmt.Errorf("lookup subject %s, ours is %s", ls, protocol.SubjFeedGet)
				}
				if _, _, err := protocol.ParseFeedSubject(ls); err == nil {
					return fmt.Errorf("the lookup subject parses as a feed")
				}
				return nil
			})
		}
		for i, c := range asArray(s["build_cases"]) {
			m := obj(c)
			t.Run("subjects/build/"+caseName(m, fmt.Sprint(i)), func() error {
				subject, err := protocol.BuildFeedSubject(str(m["agent"]), str(m["topic"]))
				if err := verdict(err == nil, str(m["verdict"]), err); err != nil {
					return err
				}
				if want := optStr(m, "subject"); err == nil && want != "" {
					return quoteDiff(subject, want)
				}
				return nil
			})
		}
		for i, c := range asArray(s["parse_cases"]) {
			m := obj(c)
			t.Run("subjects/parse/"+caseName(m, fmt.Sprint(i)), func() error {
				agent, topic, err := protocol.ParseFeedSubject(str(m["subject"]))
				if err := verdict(err == nil, str(m["verdict"]), err); err != nil {
					return err
				}
				if err == nil && (agent != optStr(m, "agent") || topic != optStr(m, "topic")) {
					return fmt.Errorf("parsed (%s, %s), want (%s, %s)", agent, topic, m["agent"], m["topic"])
				}
				return nil
			})
		}
	}
	if p, ok := doc["payload"].(map[string]any); ok {
		for i, c := range asArray(p["shape_cases"]) {
			m := obj(c)
			t.Run("payload/shape/"+caseName(m, fmt.Sprint(i)), func() error {
				pl, err := protocol.NewFeedPayload(str(m["topic"]), str(m["kind"]), m["data"])
				if err != nil {
					return err
				}
				return sameJSON(pl, m["payload"])
			})
		}
		for i, c := range asArray(p["kind_cases"]) {
			m := obj(c)
			t.Run("payload/kind/"+caseName(m, fmt.Sprint(i)), func() error {
				ok := protocol.ValidFeedKind(str(m["kind"]))
				_, err := protocol.NewFeedPayload("status", str(m["kind"]), nil)
				if ok != (err == nil) {
					return fmt.Errorf("ValidFeedKind says %v, NewFeedPayload says %v", ok, err)
				}
				return verdict(ok, str(m["verdict"]), err)
			})
		}
	}
	if sb, ok := doc["state_binding"].(map[string]any); ok {
		for i, c := range asArray(sb["kv_key_cases"]) {
			m := obj(c)
			t.Run("state_binding/kv_key/"+caseName(m, fmt.Sprint(i)), func() error {
				return quoteDiff(feeds.Key(str(m["agent"]), str(m["topic"])), str(m["key"]))
			})
		}
		for i, c := range asArray(sb["lookup_request_cases"]) {
			m := obj(c)
			t.Run("state_binding/lookup_request/"+caseName(m, fmt.Sprint(i)), func() error {
				return sameJSON(feeds.LookupRequest(str(m["agent"]), str(m["topic"])), m["payload"])
			})
		}
		if lr, ok := sb["lookup_response_members"].(map[string]any); ok {
			t.Run("state_binding/lookup_response_members", func() error {
				want := members(lr)
				for _, ans := range []map[string]any{feeds.LookupAnswer(true, []byte(`{"type":"emit"}`)), feeds.LookupAnswer(false, nil)} {
					if got := members(ans); fmt.Sprint(got) != fmt.Sprint(want) {
						return fmt.Errorf("answer members %v, want %v", got, want)
					}
				}
				if a := feeds.LookupAnswer(false, nil); a["found"] != false || a["envelope"] != nil {
					return fmt.Errorf("not found answers %v, want {found: false, envelope: null}", a)
				}
				return nil
			})
		}
	}
	if sep, ok := doc["separation"].(map[string]any); ok && sep["never"] != nil {
		t.Defer("separation", "adapter/node TestHeartbeatFeedsAndEvents: feeds are plain, unsealed emits on mesh.feed.<agent>.<topic>, a subject no inbox or mailbox captures")
	}
}
