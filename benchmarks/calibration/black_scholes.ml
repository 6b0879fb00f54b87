(* Black-Scholes prices and vega for European options, and implied volatility. *)

type option_kind = Call | Put
type quote = { kind : option_kind; strike : float; expiry : float; price : float }

let d1 ~spot ~strike ~rate ~vol ~expiry =
  (log (spot /. strike) +. ((rate +. (0.5 *. vol *. vol)) *. expiry)) /. (vol *. sqrt expiry)

let price kind ~spot ~strike ~rate ~vol ~expiry =
  let d1 = d1 ~spot ~strike ~rate ~vol ~expiry in
  let d2 = d1 -. (vol *. sqrt expiry) in
  let df = exp (-.rate *. expiry) in
  match kind with
  | Call -> (spot *. Normal.cdf d1) -. (strike *. df *. Normal.cdf d2)
  | Put -> (strike *. df *. Normal.cdf (-.d2)) -. (spot *. Normal.cdf (-.d1))

let vega ~spot ~strike ~rate ~vol ~expiry =
  spot *. Normal.pdf (d1 ~spot ~strike ~rate ~vol ~expiry) *. sqrt expiry

let implied_vol ~spot ~rate q =
  let f vol = price q.kind ~spot ~strike:q.strike ~rate ~vol ~expiry:q.expiry -. q.price in
  let df vol = vega ~spot ~strike:q.strike ~rate ~vol ~expiry:q.expiry in
  Solver.newton_bracketed ~f ~df ~lo:1e-4 ~hi:5. ~x0:0.3 ~tol:1e-12
