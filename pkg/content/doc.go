// Package content builds and reads layer0.types.v1.Content, the message
// content that crosses every protocol boundary.
//
// Constructors return ready-to-send blocks:
//
//	c := content.FromBlocks(
//		content.TextBlock("Here is the chart."),
//		content.ImageURL("https://example.com/chart.png"),
//	)
//
// and readers are nil-safe, so content.TextOf(out.GetMessage()) works on an
// absent message too.
package content
