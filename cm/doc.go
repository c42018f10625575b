// Package cm is softrnic's connection manager: it connects reliable-connected queue pairs
// the way librdmacm does (rdma_listen, rdma_connect, rdma_accept, rdma_reject,
// rdma_disconnect), by exchanging InfiniBand CM messages with the peer device's QP1 over
// RoCEv2, instead of a hand-written exchange of QP numbers, PSNs and addresses.
//
//	l, _ := cm.Listen(dev, 7471)                        // server
//	req, _ := l.Accept(ctx)
//	conn, _ := req.Accept(qp, &cm.AcceptParams{PrivateData: []byte("welcome")})
//
//	conn, err := cm.Dial(ctx, dev, netip.MustParseAddrPort("127.0.0.2:7471"), qp, // client
//		&cm.DialParams{DevicePort: 4791, PrivateData: []byte("hello")})
//
// When Dial or Accept returns, the QP is in RTS, connected to the peer's QP with the
// parameters both sides agreed on: QP numbers, starting PSNs (random; as in Linux's CM the
// Starting PSN of a REQ or REP is the PSN its sender receives first, so each side sends
// from the one the other announced),
// path MTU (the smaller of the two), RDMA READ/atomic depth (each side's initiator depth
// is at most the other's responder resources), retry and RNR retry counts, and the
// ordering mode (weakly-ordered only if both sides offer it). Post receives before Dial
// or Accept (a QP in RESET is moved to INIT first, see InitQP) so that the first SEND
// never meets an empty receive queue.
//
// A simple program makes the connection in one call, as rdma_create_ep lets a
// librdmacm program do: DialQP and Listener.AcceptQP make the PD (unless given one), a
// CQ and an RC QP, post QPConfig's receives, connect, and return an Endpoint, whose Close
// disconnects and frees them in order.
//
//	ep, err := cm.DialQP(ctx, dev, netip.MustParseAddrPort("127.0.0.2:7471"), nil, nil)
//	ep, err := l.AcceptQP(ctx, &cm.QPConfig{PD: pd, Recv: recvs}, nil) // server
//
// A QP's remote access rights (what the peer may RDMA READ, WRITE and do atomics on) are
// set once: by InitQP, or, for a QP still in RESET, by the Options of Dial or Accept
// (default: write, read and atomic). Dial and Accept keep what InitQP set unless their
// Options name rights (Access) or none (NoRemoteAccess), which replace it.
//
// Errors name the call ("cm: Dial: ...") and wrap what a caller tests with errors.Is:
// this package's errors (ErrTimeout, ErrRejected, ErrClosed, ...; after the device's
// Close, ErrClosed and verbs.ErrClosed both match), the context's error, and the verbs
// errors of the QP. docs/errors.md lists them all with what to do.
//
// # The wire
//
// CM MADs (256 bytes, management class 0x07, class version 2) in UD SENDs between the two
// devices' QP1 with the GSI Q_Key 0x80010000, laid out as IBTA Vol. 1 chapter 12 defines
// them (internal/mad), with rdma_cm's conventions on top: service ID 0x01060000 | port
// (RDMA_PS_TCP) and the 36-byte IP addressing header at the start of a ConnectRequest's
// private data, so that user private data is at most 56 bytes on connect, 196 on accept
// and 148 on reject, as librdmacm allows. A standard peer (Linux's CM over rxe or a RoCE
// NIC) sends its MADs from a UDP source port of its own and listens on 4791 only
// (RoCEv2Port): its MADs are taken from any source port of its address and answered on
// 4791; a softrnic device sends from its device port, the only one taken from it.
//
// One softrnic extension: the ordering mode offered and accepted travels in the REQ's and
// REP's Local EECN field, which IBTA reserves for RC connections. A REQ always carries it;
// Linux's CM does not read the field for RC, and the peer then gets ordered mode. A REP
// carries it only in answer to a REQ that did, so a standard requester sees the field as
// IBTA has it, zero.
//
// # UD services (SIDR)
//
// rdma_cm's UDP port space (RDMA_PS_UDP: service IDs 0x01110000 | port) has no
// connections: ResolveUD (rdma_connect on a UDP id) sends a ServiceIDResolutionRequest
// (SIDR_REQ) with the same addressing header (so 180 bytes of user private data), and a
// UDListener's request, answered with Accept (rdma_accept) or Reject (rdma_reject), sends
// back a ServiceIDResolutionResponse (SIDR_REP) with the UD QP's number and Q_Key
// (UDPQKey, 0x01234567, as rdma_cm's UD QPs have it) and 136 bytes of private data.
//
//	l, _ := cm.ListenUD(dev, 7174)                      // server: answer with a UD QP
//	req, _ := l.Accept(ctx)
//	_ = req.Accept(udQP, &cm.UDAcceptParams{PrivateData: []byte("welcome")})
//
//	rem, err := cm.ResolveUD(ctx, dev, netip.MustParseAddrPort("127.0.0.2:7174"), nil)
//	ah, _ := pd.CreateAH(&rem.AHAttr)                   // client: send to rem.QPN, rem.QKey
//
// The request is resent after the response timeout (ErrTimeout after the retries); a
// status other than success is a *SIDRError (errors.Is ErrRejected, and ErrNoListener for
// "service ID not supported", what a CM with nothing listening on the port answers).
// The listener answers a duplicate of an answered request with the same answer for a
// while, and drops one that the application has not answered yet (SIDR has no MRA);
// resolutions count against MaxREQInFlight with connection requests. A softrnic
// requester marks its SIDR_REQ in the reserved field after the P_Key, which a standard
// CM does not read, and is answered at the port it sent from; a standard one at
// RoCEv2Port. The answer is taken only with the request's request, transaction and
// service IDs, from the address it was sent to (exactly its port if that is not
// RoCEv2Port, where only a softrnic device listens).
//
// # The state machine
//
// A ConnectRequest is resent when no answer came within the CM response timeout, up to
// the maximum CM retries (ErrTimeout after that); duplicates of REQ, REP, RTU, DREQ are
// answered idempotently with the message already sent; a listener whose application has
// not accepted yet answers a resent REQ with MsgRcptAck (MRA), which makes the requester
// wait longer. Rejects carry IBTA reasons. Disconnect sends DisconnectRequest, resent until
// the DisconnectReply comes; both sides then hold the connection in time-wait, answering
// late duplicates, before forgetting it. A ConnectRequest from a peer QP that is still
// connected here (the peer restarted and reused the QP number) is rejected as stale and
// the old connection is torn down.
//
// A connection whose peer vanishes without a DisconnectRequest (its process killed) is
// found by a keep-alive: every KeepAlive interval the CM asks each peer device it has
// connections with for its ClassPortInfo (one probe per device, not per connection), and
// after KeepAliveMisses unanswered probes every connection to that device ends with
// ErrPeerUnreachable and its QP is moved to ERR. Only softrnic peers are probed (those
// whose REQ or REP carried the extension above): a standard CM need not answer
// ClassPortInfo, and its connections end on DisconnectRequest or on the QP's own retry
// errors.
//
// # Incarnations: a restarted peer
//
// A process killed and replaced by another on the same address and port (every client
// on 127.0.0.1:4791, say) would answer the keep-alive for the dead one. Each device
// therefore draws a random incarnation when it opens, and a softrnic device shows it to
// its peers: as the CA GUID of its REQs and REPs (random per device already, so a
// standard CM sees the field as it always did), and in its keep-alive probes and their
// answers, after the ClassPortInfo attribute in bytes IBTA leaves reserved (a probe
// without one, a standard CM's, is answered without one). QP1 answers a probe with the
// incarnation even on a device that does not use the CM. When the device at a peer's
// address shows another incarnation than the connections here were made with, every one
// of those connections ends at once with ErrPeerRestarted and its QP goes to ERR
// (Counters.PeerRestarts counts it): at the new process's first REQ or REP to this device,
// or at its answer to the next probe, so within one keep-alive period. The new process's
// own connections are made as usual.
//
// # Teardown
//
// Nothing waits longer on a dead peer than one keep-alive period, or than the caller's
// context: Disconnect waits for the DisconnectReply at most one keep-alive period
// (ErrTimeout after it), DisconnectContext until its context is done; Listener.Close and
// the device's Close do not wait for any peer. In every case the connection is ended on
// this side at once, and a DisconnectRequest not yet answered is resent in the
// background until the peer answers or the CM gives up on it.
//
// On Linux a device that is not there is refused at once, as TCP refuses a connection:
// when nothing is bound to the peer's device port, its host answers with ICMP port
// unreachable, and the CM ends what waited on that device. Dial fails with
// ErrPeerUnreachable within its ConnectRequest's round trip (instead of ErrTimeout after
// the retries), Disconnect returns ErrPeerUnreachable without resending its
// DisconnectRequest, and a keep-alive probe that gets the report ends every connection to
// the device with ErrPeerUnreachable at once. A report counts only if it quotes a message
// still waiting for its answer (see unreach.go). Other systems do not report ICMP errors
// to an unconnected UDP socket; there the timeouts decide.
//
// # Limits and attacks
//
// Every MAD is checked (size, class, version, method, attribute, fields) before it can
// change anything, and matched to a connection by communication ID and the sender's
// address, so a third party cannot reject, answer or disconnect another device's
// connection without sending from that device's address. A listener holds at most
// Backlog requests not yet accepted; beyond that requests are dropped (and counted), and
// their senders retry. A device has at most MaxREQInFlight ConnectRequests waiting for an
// answer at once; more Dials wait their turn, so that a burst of thousands of Dials does
// not overrun the peer's QP1 receive queue.
package cm
