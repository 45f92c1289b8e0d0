package linearizability

import (
	"strings"

	"github.com/anishathalye/porcupine"
)

// Model is the porcupine model of the ClusterIP space: the history of every address is checked
// on its own, starting free. Operations are [Op] values, as input and as output.
var Model = newModel(true)

// StrictModel is [Model] without Op.RefusalLeavesBit: refusals are taken to leave nothing
// behind. A history that Model accepts and StrictModel rejects shows a refusal leaving a bit
// behind: kube-apiserver v1.33's, or a DualWrite create's whose answer was lost.
var StrictModel = newModel(false)

func newModel(allowLeftBits bool) porcupine.Model {
	return porcupine.Model{
		Partition: partition,
		Init:      func() interface{} { return free },
		Step: func(state, input, _ interface{}) (bool, interface{}) {
			return step(state.(string), input.(Op), allowLeftBits)
		},
		DescribeOperation: func(input, _ interface{}) string {
			op := input.(Op)
			return op.Process + ": " + op.String()
		},
		DescribeState: func(state interface{}) string {
			return "{" + strings.ReplaceAll(state.(string), "\n", " | ") + "}"
		},
		DescribeOperationMetadata: func(info interface{}) string {
			if info == nil {
				return ""
			}
			return info.(string)
		},
	}
}
