(* Calibration: recover implied volatilities from a grid of option prices generated
   from a volatility smile, and fit a Nelson-Siegel curve to noisy yields; repeated
   [reps] times with slightly shifted market data. *)
open Black_scholes

let smile strike expiry = 0.2 +. (0.1 *. ((log (strike /. 100.)) ** 2.)) +. (0.02 /. sqrt expiry)

let () =
  let reps = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1 in
  let spot = 100. and rate = 0.02 in
  let strikes = Array.init 41 (fun i -> 60. +. (2. *. float i)) in
  let expiries = [| 0.1; 0.25; 0.5; 1.; 2.; 3.; 5. |] in
  let maturities = [| 0.25; 0.5; 1.; 2.; 3.; 5.; 7.; 10.; 15.; 20.; 30. |] in
  let max_err = ref 0. and vol_sum = ref 0. and fit_params = ref [||] and fit_sse = ref 0. in
  for r = 1 to reps do
    let bump = 0.001 *. float (r mod 7) in
    Array.iter
      (fun expiry ->
        Array.iter
          (fun strike ->
            let vol = smile strike expiry +. bump in
            let kind = if strike >= spot then Call else Put in
            let q = { kind; strike; expiry; price = price kind ~spot ~strike ~rate ~vol ~expiry } in
            let iv = implied_vol ~spot ~rate q in
            max_err := Float.max !max_err (Float.abs (iv -. vol));
            vol_sum := !vol_sum +. iv)
          strikes)
      expiries;
    let truth = [| 0.045; -0.02 +. bump; 0.015; 2.0 |] in
    let yields =
      Array.mapi (fun i t -> Curve.yield truth t +. (1e-4 *. float ((i * 7 mod 5) - 2))) maturities
    in
    let p, sse = Curve.fit ~maturities ~yields ~p0:[| 0.03; -0.01; 0.01; 1.5 |] ~iters:40 in
    fit_params := p;
    fit_sse := sse
  done;
  Printf.printf "implied vols: %d quotes per rep, max error %.2e, mean %.8f\n"
    (Array.length strikes * Array.length expiries) !max_err
    (!vol_sum /. float (reps * Array.length strikes * Array.length expiries));
  Printf.printf "nelson-siegel b0 %.6f b1 %.6f b2 %.6f tau %.6f\n" !fit_params.(0) !fit_params.(1)
    !fit_params.(2) !fit_params.(3);
  Printf.printf "fit rms %.3e\n" (sqrt (!fit_sse /. float (Array.length maturities)))
