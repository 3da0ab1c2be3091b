package compaction

import "github.com/secbear/neuron/services/operator/provider"

// genuineUser reports whether m is a genuine user message: role user with
// some content that is not a tool result. An empty user message is not.
func genuineUser(m provider.Message) bool {
	if m.Role != provider.User {
		return false
	}
	for _, p := range m.Parts {
		if p.ToolResult == nil {
			return true
		}
	}
	return false
}

// cutPoints returns, in increasing order, the indexes i > 0 where msgs may
// be cut, keeping msgs[i:]: msgs[i] is a genuine user message and no tool
// call is separated from its result, that is no ToolResult in msgs[i:]
// answers a ToolUse in msgs[:i]. A result is paired with the latest
// earlier call of its id, since ids may repeat across invocations (the
// scripted model's do); a result with no earlier call is ignored.
func cutPoints(msgs []provider.Message) []int {
	// blocked is a difference array: cuts in (use, result] are forbidden.
	blocked := make([]int, len(msgs)+1)
	lastUse := map[string]int{}
	for i, m := range msgs {
		for _, p := range m.Parts {
			switch {
			case p.ToolUse != nil:
				lastUse[p.ToolUse.ID] = i
			case p.ToolResult != nil:
				if u, ok := lastUse[p.ToolResult.ToolUseID]; ok && u < i {
					blocked[u+1]++
					blocked[i+1]--
				}
			}
		}
	}
	var out []int
	open := 0
	for i, m := range msgs {
		open += blocked[i]
		if i > 0 && open == 0 && genuineUser(m) {
			out = append(out, i)
		}
	}
	return out
}
