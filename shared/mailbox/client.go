package mailbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Mail is one fetched message: its stream sequence and the bytes stored,
// an envelope the caller has yet to verify.
type Mail struct {
	Seq  uint64
	Data []byte
}

// Fetch asks the mailbox worker for agent's mail after sequence after, at
// most limit messages, over nc (whose inbox prefix the messages arrive
// under). It returns the messages in stream order and the worker's
// FetchResult. The answer itself is verified; the messages are not.
func Fetch(ctx context.Context, nc *nats.Conn, agent keys.Signer, after uint64, limit int) ([]Mail, FetchResult, error) {
	req, err := protocol.New(protocol.TypeRequest, agent.Public(), FetchRequest{After: after, Limit: limit})
	if err != nil {
		return nil, FetchResult{}, err
	}
	if err := req.Sign(agent); err != nil {
		return nil, FetchResult{}, err
	}
	data, err := req.Marshal()
	if err != nil {
		return nil, FetchResult{}, err
	}
	base := nc.NewInbox()
	reply := base + ".r"
	// A channel just big enough for one fetch (at most MaxFetch messages
	// and the answer), not SubscribeSync's 64K-slot one: a busy node
	// fetches every 128 messages it takes live, and allocating and
	// clearing half a megabyte each time was a sixth of the bytes a mesh
	// request allocated (docs/performance.md).
	ch := make(chan *nats.Msg, MaxFetch+2)
	sub, err := nc.ChanSubscribe(base+".>", ch)
	if err != nil {
		return nil, FetchResult{}, fmt.Errorf("mailbox fetch: subscribe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: protocol.SubjMailboxFetch, Reply: reply, Data: data}); err != nil {
		return nil, FetchResult{}, fmt.Errorf("mailbox fetch: %w", err)
	}
	var mail []Mail
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return mail, FetchResult{}, errs.New(errs.TransportTimeout, "the mailbox did not answer in time")
			}
			return mail, FetchResult{}, fmt.Errorf("mailbox fetch: %w", ctx.Err())
		}
		if m.Subject == reply {
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				return nil, FetchResult{}, errs.New(errs.TransportNoResponders, "no mailbox worker is running")
			}
			res, err := fetchAnswer(m.Data, req.ID)
			return mail, res, err
		}
		seq, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, reply+"."), 10, 64)
		if err != nil || !strings.HasPrefix(m.Subject, reply+".") {
			continue // nothing the worker sent
		}
		mail = append(mail, Mail{Seq: seq, Data: m.Data})
	}
}

// fetchAnswer verifies the worker's answer to request id and reads its
// FetchResult.
func fetchAnswer(data []byte, id string) (FetchResult, error) {
	rep, err := protocol.Decode(data)
	if err != nil {
		return FetchResult{}, err
	}
	if rep.InReplyTo != id {
		return FetchResult{}, errs.New(errs.InvalidEnvelope, "the mailbox answer is not in reply to the fetch")
	}
	if e := bus.ErrorOf(rep); e != nil {
		return FetchResult{}, e
	}
	var out struct {
		Output FetchResult `json:"output"`
	}
	if err := json.Unmarshal(rep.Payload, &out); err != nil {
		return FetchResult{}, errs.Wrap(errs.InvalidEnvelope, "the mailbox answer has no result", err)
	}
	return out.Output, nil
}

// Ack deletes agent's handled mail from box: everything below upTo, and
// the single sequences seqs.
func Ack(ctx context.Context, nc *nats.Conn, agent keys.Signer, box string, upTo uint64, seqs []uint64) error {
	_, err := bus.Call(ctx, nc, agent, protocol.SubjMailboxAck, protocol.TypeRequest, "", AckRequest{Box: box, UpTo: upTo, Seqs: seqs})
	return err
}

// History answers credential.History through the mailbox worker: the
// control plane's question whether the bus knows an agent key.
type History struct{ Bus *bus.Caller }

// AgentHistory reports whether agent has a registration or mail.
func (h History) AgentHistory(ctx context.Context, agent string) (registered, mail bool, err error) {
	out, err := h.Bus.Call(ctx, protocol.SubjMailboxKnown, protocol.TypeRequest, KnownRequest{Agent: agent})
	if err != nil {
		return false, false, err
	}
	o, _ := out["output"].(map[string]any)
	r, ok1 := o["registered"].(bool)
	m, ok2 := o["mail"].(bool)
	if !ok1 || !ok2 {
		return false, false, errors.New("mailbox known: malformed answer")
	}
	return r, m, nil
}
