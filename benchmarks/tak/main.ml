(* Runs each Takeuchi variant on (x, y, z) and on nearby triples. Arguments: x y z,
   repetitions. *)

let () =
  let arg i d = if Array.length Sys.argv > i then int_of_string Sys.argv.(i) else d in
  let x = arg 1 18 and y = arg 2 12 and z = arg 3 6 and reps = arg 4 1 in
  let variants =
    [ ("curried", fun a b c -> Tak.tak a b c);
      ("tuple", fun a b c -> Tak.tak_tuple (a, b, c));
      ("float", fun a b c -> int_of_float (Tak.Float_tak.tak (float a) (float b) (float c)));
      ("cps", Tak.tak_cps);
      ("list", Takl.takl) ]
  in
  List.iter
    (fun (name, f) ->
      let sum = ref 0 in
      for r = 0 to reps - 1 do
        (* shift the triple a little each repetition *)
        let d = r mod 3 in
        sum := !sum + f (x - d) (y - d) (z - d)
      done;
      Printf.printf "%-8s tak %d %d %d = %d, sum over %d runs %d\n" name x y z (f x y z) reps !sum)
    variants
