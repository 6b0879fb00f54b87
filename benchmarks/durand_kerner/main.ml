(* Roots of random monic polynomials with known roots, by Durand-Kerner and by Aberth;
   reports iterations and whether every computed root matches a true one. *)

let matched truth z =
  Array.for_all (fun t -> Array.exists (fun r -> Cx.abs (Cx.sub r t) < 1e-6) z) truth

let () =
  let degree = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10 in
  let count = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 10 in
  let st = ref 31337 in
  let rnd () = st := ((!st * 69069) + 1) land 0xffffffff; (float_of_int (!st lsr 8) /. 16777216.) -. 0.5 in
  let methods = [ ("durand-kerner", Poly.durand_kerner); ("aberth", Poly.aberth) ] in
  let stats = List.map (fun (name, _) -> (name, ref 0, ref 0, ref Cx.zero)) methods in
  for _ = 1 to count do
    let truth = Array.init degree (fun _ -> Cx.make (4. *. rnd ()) (4. *. rnd ())) in
    let p = Poly.of_roots truth in
    List.iter2
      (fun (_, corr) (_, iters, ok, sum) ->
        let z, it = Poly.solve corr p in
        iters := !iters + it;
        if matched truth z then incr ok;
        sum := Array.fold_left Cx.add !sum z)
      methods stats
  done;
  Printf.printf "degree %d polynomials %d\n" degree count;
  List.iter
    (fun (name, iters, ok, sum) ->
      Printf.printf "%s: iterations %d matched %d/%d root sum %.6f %+.6fi\n" name !iters !ok count
        !sum.Cx.re !sum.Cx.im)
    stats
